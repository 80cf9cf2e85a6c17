from __future__ import annotations

from rest_framework import serializers


class RegistrationSerializer(serializers.Serializer):
    join_token = serializers.CharField(max_length=200, trim_whitespace=True)
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", help_text="The node's name.")
    address = serializers.CharField(max_length=255, allow_blank=True, default="")
    emulated = serializers.BooleanField(default=False)
    devices = serializers.ListField(child=serializers.DictField(), max_length=64, default=list)


class RegistrationResultSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    node_credential = serializers.CharField()
    incarnation = serializers.IntegerField()
    queue = serializers.CharField()
    broker_url = serializers.CharField()
    broker_transport_options = serializers.DictField()
    heartbeat_interval_s = serializers.FloatField()

