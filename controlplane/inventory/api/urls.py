from rest_framework.routers import DefaultRouter

from controlplane.inventory.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("nodes", views.NodeViewSet)
router.register("devices", views.DeviceViewSet)
router.register("links", views.LinkViewSet)
router.register("gpu-models", views.GpuModelViewSet, basename="gpumodel")

urlpatterns = router.urls
