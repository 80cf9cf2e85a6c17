from rest_framework.routers import DefaultRouter

from controlplane.models_catalog.api import views

router = DefaultRouter()
router.include_root_view = False
router.register("models", views.LlmModelViewSet)

urlpatterns = router.urls
