"""The torch side of motley: stages of a LLaMA-family model, quantized and batched (no Django, no Celery)."""
