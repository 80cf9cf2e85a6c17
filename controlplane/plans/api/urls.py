from django.urls import path

from controlplane.plans.api.views import PlanCalibrationView, PlanPreviewView, PlanValidateView

urlpatterns = [
    path("plans/", PlanPreviewView.as_view(), name="plan-preview"),
    path("plans/validate/", PlanValidateView.as_view(), name="plan-validate"),
    path("plans/calibration/", PlanCalibrationView.as_view(), name="plan-calibration"),
]
