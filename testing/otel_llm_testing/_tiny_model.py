"""Build a tiny random-weight Llama (tokenizer and weights) into a directory, with no download.

Run by the vLLM virtualenv's interpreter (it has ``tokenizers``, ``transformers`` and torch),
never imported by otel_llm itself:

    python _tiny_model.py OUTPUT_DIR

The text it generates is noise; what vLLM does with it (scheduling, batching, queueing, metrics,
tracing) is vLLM's own. Seeded, so two builds give the same weights.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# A few hundred words are enough for a 512-token byte-level BPE.
CORPUS = [
    "Where did the time go? DNS, connect, TLS, upload, server wait, first token, decode.",
    "The quick brown fox jumps over the lazy dog while the model decodes one token at a time.",
    "A language model behind an HTTP API answers requests, streams chunks and reports usage.",
    "Time to first byte is not time to first token; a proxy that buffers hides the stream.",
    "Continuous batching shares the compute between requests; a queue makes the last one wait.",
    "Hello, how are you today? I am fine, thank you. Tell me a story about a small robot.",
    "user: what is the capital of France? assistant: Paris is the capital of France.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = ( ) [ ] { } < > : ; , . ! ? ' \" # @ & %",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build(output: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                      pad_token="<pad>", unk_token="<unk>")
    wrapped.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(wrapped), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=wrapped.bos_token_id,
                         eos_token_id=wrapped.eos_token_id, pad_token_id=wrapped.pad_token_id,
                         torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    output.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(output)
    model.save_pretrained(output)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build(Path(sys.argv[1]))
