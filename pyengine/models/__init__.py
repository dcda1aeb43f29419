"""Model definitions: one file per GGUF architecture, found through the registry."""

from __future__ import annotations

from pyengine.gguf import GGUFFile
# each import registers an architecture
from pyengine.models import (  # noqa: F401
    bert, deepseek2, ernie4_5, exaone4, falcon_h1, gemma2, gemma3, gemma_embedding, glm4, glm4moe, gpt_oss, granite,
    granitehybrid, hunyuan_dense, jina_bert_v2, lfm2, lfm2moe, llama, llama4, mamba2, mistral3, modern_bert,
    nemotron_h, nomic_bert, nomic_bert_moe, olmo2, phi3, qwen2, qwen2vl, qwen3, qwen3vl, qwen3vlmoe, qwen35,
    qwen35moe, qwen3moe, qwen3next, smollm3,
)
from pyengine.models.binding import bind
from pyengine.models.registry import architectures, model_for_arch, register

__all__ = ["load_model", "architectures", "model_for_arch", "register"]


def load_model(gguf: GGUFFile):
    """Bind the architecture's model class to the file's tensors."""
    cls = model_for_arch(gguf.architecture)
    cfg = cls.Config.from_gguf(gguf)
    return bind(cls, gguf, cfg)
