import django_filters

from controlplane.models_catalog.models import LlmModel


class LlmModelFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = LlmModel
        fields = ["model_type", "has_weights", "num_layers", "torch_dtype"]
