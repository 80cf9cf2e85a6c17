from django.urls import path

from controlplane.plans.api.views import PlanPreviewView, PlanValidateView

urlpatterns = [
    path("plans/", PlanPreviewView.as_view(), name="plan-preview"),
    path("plans/validate/", PlanValidateView.as_view(), name="plan-validate"),
]
