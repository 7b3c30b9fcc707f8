"""Text encoders: a transformers AutoModel with peft LoRA adapters, mean pooling."""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_encoders():
    from graphveil.plugins.hf_lora.encoder import HfLoraEncoder
    from graphveil.plugins.hf_lora.frozen_head import FrozenHeadEncoder

    return {"hf_lora": HfLoraEncoder, "frozen_head": FrozenHeadEncoder}
