from django.urls import path

from controlplane.enrollment.api import views

urlpatterns = [
    path("agents/register/", views.AgentRegisterView.as_view(), name="agent-register"),
]
