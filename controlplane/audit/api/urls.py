from rest_framework.routers import DefaultRouter

from controlplane.audit.api.views import AuditEntryViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("audit", AuditEntryViewSet)

urlpatterns = router.urls
