from django.urls import path

from controlplane.rebalance.api import views

urlpatterns = [
    path("deployments/<int:pk>/proposals/", views.DeploymentProposalList.as_view(),
         name="deployment-proposals"),
    path("rebalance-proposals/<int:pk>/accept/", views.ProposalAccept.as_view(),
         name="rebalance-proposal-accept"),
    path("rebalance-proposals/<int:pk>/dismiss/", views.ProposalDismiss.as_view(),
         name="rebalance-proposal-dismiss"),
]
