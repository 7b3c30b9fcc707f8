"""Decoder LLM encoders (Llama, Mistral, Qwen) with peft LoRA adapters, last-token pooling."""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_encoders():
    from graphveil.plugins.hf_causal.encoder import HfCausalEncoder

    return {"hf_causal_lora": HfCausalEncoder}
