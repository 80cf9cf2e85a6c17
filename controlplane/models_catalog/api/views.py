from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.audit.services import audit_context
from controlplane.models_catalog.api import filtersets, serializers
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.models_catalog.services import model_register, model_unregister


class LlmModelViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Registered models. A model is not edited in place: register the checkpoint again to refresh it."""

    queryset = LlmModel.objects.all()
    serializer_class = serializers.LlmModelSerializer
    filterset_class = filtersets.LlmModelFilterSet
    ordering_fields = ["name", "total_params", "num_layers", "created"]

    def get_queryset(self):
        # Lists leave the two JSON documents in the database; a single model brings its config.
        queryset = super().get_queryset()
        return queryset.defer("config", "profile", "quality") if self.action == "list" else queryset

    def get_serializer_class(self):
        return serializers.LlmModelDetailSerializer if self.action == "retrieve" else self.serializer_class

    @extend_schema(
        request=serializers.ModelRegisterSerializer, responses={201: serializers.LlmModelDetailSerializer}
    )
    def create(self, request: Request) -> Response:
        registration = serializers.ModelRegisterSerializer(data=request.data)
        registration.is_valid(raise_exception=True)
        model = model_register(**registration.validated_data, actor=audit_context(request))
        body = serializers.LlmModelDetailSerializer(model, context=self.get_serializer_context()).data
        return Response(body, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: LlmModel) -> None:
        model_unregister(model=instance, actor=audit_context(self.request))

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True)
    def profile(self, request: Request, pk: str) -> Response:
        """Per-layer parameters, weight bytes at 16/8/4 bits, FLOPs and KV bytes per token."""
        return Response(model_profile(model=self.get_object()).to_dict())

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True)
    def quality(self, request: Request, pk: str) -> Response:
        """Measured quality (``manage.py profile_quality``): perplexity at fp32/bf16/int8/int4 and KL per
        layer at int8/int4; ``{}`` when never measured."""
        return Response(self.get_object().quality)
