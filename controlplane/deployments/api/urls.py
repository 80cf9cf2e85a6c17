from django.urls import path
from rest_framework.routers import DefaultRouter

from controlplane.deployments.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("deployments", views.DeploymentViewSet)

urlpatterns = [
    *router.urls,
    path("nodes/<int:pk>/drain/", views.NodeDrainView.as_view(), name="node-drain"),
]
