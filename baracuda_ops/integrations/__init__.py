"""Integrations with model libraries: ``baracuda_ops.integrations.transformers`` patches
Hugging Face transformers models to run their norms on baracuda ops."""
