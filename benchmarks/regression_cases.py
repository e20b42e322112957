"""The notebooks of the regression corpus (``regression_corpus.py``): five families of real
models as a user's notebook builds them, and regressions injected into them by editing one
cell's code, each with what a correct explanation names.

A notebook is a list of cells; a regression is a list of edits ``(cell, old, new)`` (the
text ``old`` of that cell replaced by ``new``, which must occur exactly once) and the
targets: the cells that must be reported as regressions of their own, each with the
reasons a correct explanation names:

- ``("category", {"activations"})``: the category whose bytes at the peak grew most is one
  of these;
- ``("module", "h.2")``: the module whose bytes at the peak grew most contains this text;
- ``("line", "model(ids")``: the line that keeps most more contains this text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Every family's first cell initialises CUDA, as notebooks that print the GPU's name do:
# from the next cell on, tracking records lines and each cell's peak can be broken down.
SETUP = "torch.manual_seed(0)\nprint(torch.cuda.get_device_name(0))"

RESNET = [
    "import torch\nimport torch.nn.functional as F\nimport torchvision\n" + SETUP,
    (
        "model = torchvision.models.resnet18(num_classes=100).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)"
    ),
    (
        'x = torch.randn(32, 3, 128, 128, device="cuda")\n'
        'y = torch.randint(0, 100, (32,), device="cuda")'
    ),
    (
        "for step in range(3):\n"
        '    with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "        out = model(x)\n"
        "        loss = F.cross_entropy(out, y)\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()"
    ),
    (
        "model.eval()\n"
        "with torch.no_grad():\n"
        "    out = model(x)\n"
        "acc = (out.argmax(1) == y).float().mean().item()"
    ),
]

GPT2 = [
    "import torch\nfrom transformers import GPT2Config, GPT2LMHeadModel\n" + SETUP,
    (
        "cfg = GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=512)\n"
        'model = GPT2LMHeadModel(cfg).to("cuda", torch.bfloat16)\n'
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-4)"
    ),
    'ids = torch.randint(0, cfg.vocab_size, (8, 256), device="cuda")',
    (
        "preds = []\n"
        "for step in range(3):\n"
        '    with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "        out = model(ids, labels=ids)\n"
        "    out.loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "    preds.append(out.logits.argmax(-1))"
    ),
    "with torch.no_grad():\n    logits = model(ids[:2]).logits",
]

BERT = [
    "import torch\nfrom transformers import BertConfig, BertForSequenceClassification\n" + SETUP,
    (
        "cfg = BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,\n"
        '                 intermediate_size=2048, vocab_size=8192, attn_implementation="sdpa")\n'
        "model = BertForSequenceClassification(cfg).cuda()\n"
        "model.gradient_checkpointing_enable()\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=2e-5)"
    ),
    (
        'ids = torch.randint(0, cfg.vocab_size, (16, 256), device="cuda")\n'
        'labels = torch.randint(0, 2, (16,), device="cuda")'
    ),
    (
        "for step in range(2):\n"
        "    out = model(input_ids=ids, labels=labels)\n"
        "    out.loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()"
    ),
]

LSTM = [
    "import torch\nimport torch.nn as nn\n" + SETUP,
    (
        "class Tagger(nn.Module):\n"
        "    def __init__(self, vocab=8000, dim=256, hidden=512, layers=2):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(vocab, dim)\n"
        "        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)\n"
        "        self.head = nn.Linear(hidden, vocab)\n"
        "\n"
        "    def forward(self, x):\n"
        "        h, _ = self.lstm(self.emb(x))\n"
        "        return self.head(h)"
    ),
    "model = Tagger().cuda()\nopt = torch.optim.Adam(model.parameters())",
    'x = torch.randint(0, 8000, (32, 128), device="cuda")',
    (
        "for step in range(2):\n"
        "    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()"
    ),
]

# PyTorch's own tutorial model: a transformer encoder with a positional-encoding buffer.
ENCODER = [
    "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n" + SETUP,
    (
        "class PositionalEncoding(nn.Module):\n"
        "    def __init__(self, d_model, max_len=5000):\n"
        "        super().__init__()\n"
        "        position = torch.arange(max_len).unsqueeze(1)\n"
        "        div_term = torch.exp(\n"
        "            torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model)\n"
        "        )\n"
        "        pe = torch.zeros(max_len, 1, d_model)\n"
        "        pe[:, 0, 0::2] = torch.sin(position * div_term)\n"
        "        pe[:, 0, 1::2] = torch.cos(position * div_term)\n"
        '        self.register_buffer("pe", pe)\n'
        "\n"
        "    def forward(self, x):\n"
        "        return x + self.pe[: x.size(0)]\n"
        "\n"
        "\n"
        "class Encoder(nn.Module):\n"
        "    def __init__(self, ntoken=8000, d=512, nhead=8, layers=4, max_len=5000):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(ntoken, d)\n"
        "        self.pos = PositionalEncoding(d, max_len)\n"
        "        layer = nn.TransformerEncoderLayer(d, nhead, 4 * d)\n"
        "        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)\n"
        "        self.head = nn.Linear(d, ntoken)\n"
        "\n"
        "    def forward(self, src):\n"
        "        return self.head(self.enc(self.pos(self.emb(src))))"
    ),
    "model = Encoder().cuda()\nopt = torch.optim.AdamW(model.parameters())",
    'src = torch.randint(0, 8000, (256, 16), device="cuda")',
    (
        "for step in range(2):\n"
        "    out = model(src)\n"
        "    loss = F.cross_entropy(out.flatten(0, 1), src.flatten())\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()"
    ),
]

FAMILIES: dict[str, list[str]] = {
    "resnet18": RESNET,
    "gpt2": GPT2,
    "bert": BERT,
    "lstm": LSTM,
    "encoder": ENCODER,
}

ACTIVATIONS = ("category", frozenset({"activations"}))
PARAMETER_STATE = ("category", frozenset({"parameters", "gradients", "optimizer state"}))


@dataclass(frozen=True)
class Regression:
    name: str
    family: str
    what: str  # in words
    edits: tuple[tuple[int, str, str], ...]
    # cell index -> the reasons it must name
    targets: dict[int, tuple[tuple[str, object], ...]] = field(default_factory=dict)


REGRESSIONS: tuple[Regression, ...] = (
    Regression(
        "resnet-resolution",
        "resnet18",
        "a larger activation: images 160 px instead of 128",
        ((2, "32, 3, 128, 128", "32, 3, 160, 160"),),
        {3: (ACTIVATIONS,), 2: (("line", "x = torch.randn"),)},
    ),
    Regression(
        "resnet-adam",
        "resnet18",
        "an optimizer swap: Adam instead of SGD with momentum",
        (
            (
                1,
                "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)",
                "torch.optim.Adam(model.parameters(), lr=1e-3)",
            ),
        ),
        {3: (("category", frozenset({"optimizer state"})),)},
    ),
    Regression(
        "resnet-fp32",
        "resnet18",
        "a dtype change: the step without bf16 autocast (fp32 activations)",
        (
            (
                3,
                'torch.autocast("cuda", dtype=torch.bfloat16)',
                'torch.autocast("cuda", enabled=False)',
            ),
        ),
        {3: (ACTIVATIONS,)},
    ),
    Regression(
        "resnet-cudnn-benchmark",
        "resnet18",
        "cuDNN convolutions that pick other algorithms: cudnn.benchmark on",
        (
            (
                0,
                "torch.manual_seed(0)",
                "torch.backends.cudnn.benchmark = True\ntorch.manual_seed(0)",
            ),
        ),
        {3: (("category", frozenset({"temporaries", "block slack"})),)},
    ),
    Regression(
        "resnet-eval-graph",
        "resnet18",
        "a kept reference: evaluation without no_grad keeps the graph",
        ((4, "with torch.no_grad():\n    out = model(x)", "out = model(x)"),),
        {4: (("line", "out = model(x)"),)},
    ),
    Regression(
        "resnet-batch-33",
        "resnet18",
        "a slightly larger activation: 33 images a batch instead of 32",
        ((2, "32, 3, 128, 128", "33, 3, 128, 128"), (2, "(32,)", "(33,)")),
        {3: (ACTIVATIONS,)},
    ),
    Regression(
        "gpt2-sequence-260",
        "gpt2",
        "a slightly larger activation: sequences of 260 tokens instead of 256",
        ((2, "(8, 256)", "(8, 260)"),),
        {3: (ACTIVATIONS,)},
    ),
    Regression(
        "gpt2-one-layer",
        "gpt2",
        "one transformer layer changed: block 2's MLP four times wider",
        (
            (
                1,
                "torch.bfloat16)\n",
                (
                    "torch.bfloat16)\n"
                    "mlp = type(model.transformer.h[2].mlp)(16 * cfg.n_embd, cfg)\n"
                    'model.transformer.h[2].mlp = mlp.to("cuda", torch.bfloat16)\n'
                ),
            ),
        ),
        {3: (("module", "h.2"),)},
    ),
    Regression(
        "gpt2-sequence",
        "gpt2",
        "a larger activation: sequences of 320 tokens instead of 256",
        ((2, "(8, 256)", "(8, 320)"),),
        {3: (ACTIVATIONS,)},
    ),
    Regression(
        "gpt2-fp32-weights",
        "gpt2",
        "a dtype change: weights (and so gradients and AdamW's state) in fp32 instead of bf16",
        ((1, '.to("cuda", torch.bfloat16)', '.to("cuda", torch.float32)'),),
        {3: (PARAMETER_STATE,), 1: (("line", "model = GPT2LMHeadModel"),)},
    ),
    Regression(
        "gpt2-logits-leak",
        "gpt2",
        "a leak that grows per step: each step's logits kept",
        ((3, "preds.append(out.logits.argmax(-1))", "preds.append(out.logits.detach())"),),
        {3: (("line", "model(ids, labels=ids)"),)},
    ),
    Regression(
        "gpt2-grads-kept",
        "gpt2",
        "a kept reference: gradients zeroed in place instead of freed",
        ((3, "opt.zero_grad()", "opt.zero_grad(set_to_none=False)"),),
        # gradients are made by autograd's own thread, with no line of the cell on its stack:
        # the category names them
        {3: (("category", frozenset({"gradients"})),)},
    ),
    Regression(
        "bert-eager-attention",
        "bert",
        "attention computed eagerly instead of with SDPA",
        ((1, 'attn_implementation="sdpa"', 'attn_implementation="eager"'),),
        {3: (("module", "attention"),)},
    ),
    Regression(
        "bert-no-checkpointing",
        "bert",
        "gradient checkpointing switched off",
        ((1, "model.gradient_checkpointing_enable()\n", ""),),
        {3: (ACTIVATIONS,)},
    ),
    Regression(
        "lstm-third-layer",
        "lstm",
        "one more LSTM layer",
        ((2, "Tagger()", "Tagger(layers=3)"),),
        {4: (("module", "lstm"),)},
    ),
    Regression(
        "encoder-position-buffer",
        "encoder",
        "a larger buffer in one module: positions up to 100,000",
        ((2, "Encoder()", "Encoder(max_len=100_000)"),),
        # the training step's figures grow too, but only because it begins with more: the
        # comparison lists it as carried, and the build cell is the regression
        {2: (("line", "model = Encoder("), ("category", frozenset({"buffers"})))},
    ),
    Regression(
        "encoder-batch",
        "encoder",
        "a larger activation: 24 sequences a batch instead of 16",
        ((3, "(256, 16)", "(256, 24)"),),
        {4: (ACTIVATIONS,)},
    ),
)


def edited(family: list[str], edits: tuple[tuple[int, str, str], ...]) -> list[str]:
    cells = list(family)
    for i, old, new in edits:
        if cells[i].count(old) != 1:
            raise ValueError(f"cell {i}: {old!r} occurs {cells[i].count(old)} times")
        cells[i] = cells[i].replace(old, new)
    return cells
