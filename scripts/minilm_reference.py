"""Reference sentence embeddings for all-MiniLM-L6-v2, for the local embedder's test.

An implementation independent of candle: the BERT encoder in NumPy, read straight from
model.safetensors, then sentence-transformers' mean pooling over the attention mask and
L2 normalisation. The tokenizer is Hugging Face's (the Python binding), cut to 256 tokens
as sentence_bert_config.json says. Run once, its output committed:

    python scripts/minilm_reference.py MODEL_DIR > tests/fixtures/minilm-reference.json

(needs `numpy` and `tokenizers`). A tokenizer, pooling or truncation mistake on the Rust
side moves the vectors far from these (the test asks for cosine >= 0.999).
"""

import json
import struct
import sys
from math import erf, sqrt

import numpy as np
from tokenizers import Tokenizer

SENTENCES = [
    "I'm vegetarian",
    "what does she not eat?",
    "The weather is lovely today.",
    "Remind me to call the dentist on Tuesday at 3pm.",
    # Longer than 256 tokens: cut where sentence-transformers cuts.
    " ".join(["The quarterly report is due next Friday and the figures are not in yet."] * 30),
]


def main(model_dir):
    raw = open(f"{model_dir}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    weights = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        start, end = t["data_offsets"]
        weights[name] = np.frombuffer(raw[8 + n + start : 8 + n + end], dtype=np.float32).reshape(t["shape"])

    def w(name):
        return weights[name] if name in weights else weights["bert." + name]

    config = json.load(open(f"{model_dir}/config.json"))
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    gelu = np.vectorize(lambda x: 0.5 * x * (1 + erf(x / sqrt(2))))

    def norm(x, weight, bias, eps=config["layer_norm_eps"]):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * weight + bias

    def embed(text):
        ids = np.array(tokenizer.encode(text).ids)
        length = len(ids)
        x = (
            w("embeddings.word_embeddings.weight")[ids]
            + w("embeddings.position_embeddings.weight")[:length]
            + w("embeddings.token_type_embeddings.weight")[0]
        )
        x = norm(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        heads = config["num_attention_heads"]
        d = config["hidden_size"] // heads
        for i in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def linear(t, name):
                return t @ w(p + name + ".weight").T + w(p + name + ".bias")

            def split(t):
                return t.reshape(length, heads, d).transpose(1, 0, 2)

            q = split(linear(x, "attention.self.query"))
            k = split(linear(x, "attention.self.key"))
            v = split(linear(x, "attention.self.value"))
            a = q @ k.transpose(0, 2, 1) / np.sqrt(d)
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            context = (a @ v).transpose(1, 0, 2).reshape(length, heads * d)
            x = norm(
                linear(context, "attention.output.dense") + x,
                w(p + "attention.output.LayerNorm.weight"),
                w(p + "attention.output.LayerNorm.bias"),
            )
            h = gelu(linear(x, "intermediate.dense"))
            x = norm(linear(h, "output.dense") + x, w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias"))
        mean = x.mean(0)
        return mean / np.linalg.norm(mean)

    out = [{"text": s, "vector": [round(float(f), 7) for f in embed(s)]} for s in SENTENCES]
    json.dump({"model": "sentence-transformers/all-MiniLM-L6-v2@1110a24", "sentences": out}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
