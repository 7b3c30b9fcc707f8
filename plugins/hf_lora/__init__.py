"""Text encoders: a transformers AutoModel with peft LoRA adapters, mean pooling."""

from graphveil.hookspecs import hookimpl


@hookimpl
def graphveil_encoders():
    from graphveil.plugins.hf_lora.encoder import HfLoraEncoder

    return {"hf_lora": HfLoraEncoder}
