"""Writes examples/before_you_run.ipynb (kept as code so that it stays reviewable).

The committed notebook holds the outputs of a run on the project's GPU machine:
``jupyter-gpumem run examples/before_you_run.ipynb --output examples/before_you_run.ipynb``
after writing it with this script. The README's "Before you run" quotes them. It needs
transformers (GPT-2 with random weights: nothing is downloaded)."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell


def failing(source: str) -> nbf.NotebookNode:
    cell = code(source)
    cell.metadata["tags"] = ["raises-exception"]  # the notebook goes on (nbclient, Jupyter)
    return cell


step = (
    "x = torch.randint(0, 50257, (batch, 1024), device='cuda')\n"
    "loss = model(x, labels=x).loss\n"
    "loss.backward()\n"
    "opt.step()\n"
    "opt.zero_grad()"
)
cells = [
    md("# Before you run: what a step's peak is made of, and the largest batch that fits\n\n"
       "GPT-2 (124M parameters, random weights) trained with AdamW on 1024-token sequences. "
       "It needs a CUDA GPU and `transformers` (`pip install transformers`; GPT-2 is built "
       "from its config, so nothing is downloaded)."),
    code("%load_ext gpumem\nimport torch\nfrom transformers import GPT2Config, GPT2LMHeadModel\n"
         "torch.manual_seed(0)\n"
         "model = GPT2LMHeadModel(GPT2Config()).cuda()\n"
         "opt = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
         "batch = 4"),
    md("## What the peak is made of\n\n`--breakdown` names every byte alive at the step's "
       "peak: weights, gradients, optimizer state, what autograd saved for backward, "
       "temporaries. The categories add up to the allocator's own peak exactly."),
    code("%%gpumem --breakdown\n" + step),
    md("The same step again: the optimizer state now exists from the start."),
    code("%%gpumem --breakdown\n" + step),
    md("## The largest batch that fits on a 24 GB card\n\n`--scan` runs the step at a few "
       "batch sizes, fits the peak, predicts the largest batch for the target (here a card "
       "of 24 GiB, less what this process holds outside PyTorch) and runs it under that cap "
       "to verify."),
    code("%%gpumem --scan batch=2,4,8 --fit-in RTX4090\n" + step),
    md("## Out of memory: what the cell needs, and which fix is enough\n\nUnder a 12 GiB "
       "cap, batch 64 runs out. The fixes are judged against what the step needs (known "
       "from the scan above), not against the last request."),
    code("%gpumem limit 12GiB\nbatch = 64"),
    failing("%%gpumem\n" + step),
    code("%gpumem release-traceback\n%gpumem limit off"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "examples/before_you_run.ipynb")
