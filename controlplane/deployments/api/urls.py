from django.urls import path
from rest_framework.routers import DefaultRouter

from controlplane.deployments.api import events, views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("deployments", views.DeploymentViewSet)
router.register("events", events.DeploymentEventViewSet)

urlpatterns = [
    *router.urls,
    path("nodes/<int:pk>/drain/", views.NodeDrainView.as_view(), name="node-drain"),
]
