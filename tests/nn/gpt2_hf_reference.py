"""Reference files and values of tests/nn/gpt2_io_test.cc (development only; not run in CI).

Builds a tiny random HuggingFace transformers GPT-2 (2 layers, 2 heads, n_embd 16, n_positions 32,
vocabulary 100: tapegrad pads it to 128 rows, so the padding path runs on real logits), saves it
with save_pretrained into tests/nn/testdata/gpt2_tiny_hf/ (model.safetensors + config.json,
about 40 KB, committed), and prints the C++ literals of the test: the f32 logits that
transformers computes for TOKENS at LOGIT_POSITIONS.

    python3 -m venv /tmp/hfv && /tmp/hfv/bin/pip install transformers safetensors torch
    /tmp/hfv/bin/python tests/nn/gpt2_hf_reference.py             # rewrites testdata, prints

The other direction, run by hand once after a change of the exporter (the C++ test cannot run
Python): export the tiny model with tapegrad and check that transformers loads the directory and
computes the same logits:

    bazel build --config=cpu //tools:train_gpt
    bazel-bin/tools/train_gpt --init_from=tests/nn/testdata/gpt2_tiny_hf --steps=0 \
        --export_hf=/tmp/gpt2_export
    /tmp/hfv/bin/python tests/nn/gpt2_hf_reference.py --check_export=/tmp/gpt2_export

(last run: transformers 5.24.0, torch 2.15.0: max |difference| 0. Done the same way with a
1-layer, 8-wide GPT-2 of vocabulary 50257: tapegrad pads it to 50304, the export has 50257 rows
and transformers' logits of the export equal the original's exactly.)

A character-level model's export (needs transformers only, not torch): its tokenizer encodes the
training text to the ids tapegrad trained on, decodes them back, and declares no end-of-text
token:

    bazel-bin/tools/train_gpt --data=text.txt --steps=2 --export_hf=/tmp/char_export ...
    /tmp/hfv/bin/python tests/nn/gpt2_hf_reference.py --check_char_export=/tmp/char_export \
        --text=text.txt

(last run: transformers 5.24.0, tokenizers 0.23.3, a 65-byte text with 'é' (two bytes): the same
65 ids, the same text back, no bos/eos, 35 tokens.)
"""

import argparse
import os

from transformers import GPT2Config, GPT2LMHeadModel

try:
    import torch
except ImportError:  # --check_char_export needs no torch
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "testdata", "gpt2_tiny_hf")

TOKENS = [[5, 99, 0, 42, 17, 63, 8, 31, 77, 2, 50, 14]]
LOGIT_POSITIONS = [0, 5, 11]  # every vocabulary entry at these positions of TOKENS[0]


def build():
    torch.manual_seed(20)
    config = GPT2Config(vocab_size=100, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=99, eos_token_id=99)
    model = GPT2LMHeadModel(config)
    # Larger values than GPT-2's N(0, 0.02) init, so that the logits are far from uniform and
    # every parameter (LayerNorm affine included) changes them visibly.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                    name.endswith("ln_f.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


def logits_of(model):
    with torch.no_grad():
        return model(torch.tensor(TOKENS)).logits[0]  # [seq, vocab] f32


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check_export", help="a directory written by tapegrad's ExportGpt2Hf")
    parser.add_argument("--check_char_export",
                        help="a character-level model's export (train_gpt --data=TEXT "
                             "--export_hf=DIR): its tokenizer gives the ids tapegrad trained on")
    parser.add_argument("--text", help="with --check_char_export: the training text file")
    args = parser.parse_args()
    if args.check_char_export:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.check_char_export)
        data = open(args.text, "rb").read()
        vocab = sorted(set(data))  # tapegrad's CharTokenizer: the distinct bytes, in order
        expected = [vocab.index(b) for b in data]
        ids = tok(data.decode("utf-8"))["input_ids"]
        assert ids == expected, (ids[:20], expected[:20])
        assert tok.decode(ids) == data.decode("utf-8")
        assert tok.eos_token_id is None and tok.bos_token_id is None
        config = GPT2Config.from_pretrained(args.check_char_export)
        assert config.eos_token_id is None and config.vocab_size == len(vocab)
        print("tokenizer of %s: %d ids as tapegrad's, decode round trip, no end-of-text token"
              % (args.check_char_export, len(ids)))
        return
    if args.check_export:
        reference = logits_of(GPT2LMHeadModel.from_pretrained(OUT_DIR).eval())
        exported = GPT2LMHeadModel.from_pretrained(args.check_export).eval()
        got = logits_of(exported)
        diff = (got - reference).abs().max().item()
        print("transformers loaded %s: logits %s, max |difference| to the reference %g"
              % (args.check_export, tuple(got.shape), diff))
        assert got.shape == reference.shape and diff <= 1e-5, diff
        return

    model = build()
    model.save_pretrained(OUT_DIR, safe_serialization=True)
    # save_pretrained may add generation_config.json; the test needs only these two files.
    extra = os.path.join(OUT_DIR, "generation_config.json")
    if os.path.exists(extra):
        os.remove(extra)
    # What the test compares with: the model as read back from the committed files.
    logits = logits_of(GPT2LMHeadModel.from_pretrained(OUT_DIR).eval())
    import transformers
    print("// Generated by tests/nn/gpt2_hf_reference.py (transformers %s, torch %s, float32)."
          % (transformers.__version__, torch.__version__))
    print("const std::vector<int64_t> kTokens = {%s};" % ", ".join(str(t) for t in TOKENS[0]))
    print("const std::vector<int64_t> kLogitPositions = {%s};"
          % ", ".join(str(p) for p in LOGIT_POSITIONS))
    print("// Logits at kLogitPositions, every vocabulary entry.")
    print("const std::vector<std::vector<float>> kLogits = {")
    for pos in LOGIT_POSITIONS:
        values = ["%.9gf" % v for v in logits[pos].tolist()]
        lines, line = [], "    {"
        for n, v in enumerate(values):
            piece = v + ("," if n + 1 < len(values) else "},")
            if len(line) + 1 + len(piece) > 100:
                lines.append(line)
                line = "     " + piece
            else:
                line += ("" if line.endswith("{") else " ") + piece
        lines.append(line)
        print("\n".join(lines))
    print("};")


if __name__ == "__main__":
    main()
