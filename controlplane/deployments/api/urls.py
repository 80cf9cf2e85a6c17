from django.urls import path
from rest_framework.routers import DefaultRouter

from controlplane.deployments.api import events, nodes, views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("deployments", views.DeploymentViewSet)
router.register("events", events.DeploymentEventViewSet)

urlpatterns = [
    *router.urls,
    path("nodes/<int:pk>/cordon/", nodes.NodeCordonView.as_view(), name="node-cordon"),
    path("nodes/<int:pk>/uncordon/", nodes.NodeUncordonView.as_view(), name="node-uncordon"),
    path("nodes/<int:pk>/drain/", nodes.NodeDrainView.as_view(), name="node-drain"),
    path("nodes/<int:pk>/undrain/", nodes.NodeUndrainView.as_view(), name="node-undrain"),
]
