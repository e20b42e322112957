"""Writes examples/ci/train_budget.ipynb (kept as code so that it stays reviewable).

A small training notebook with per-cell GPU memory budgets in its tags, for
`jupyter-gpumem run` (see docs/run.md and examples/ci/gpumem-budget.yml)."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell


def tagged(source, *tags):
    return code(source, metadata={"tags": list(tags)})


cells = [
    md("# A training step within a memory budget\n\n"
       "Run it headless and check its budgets:\n\n"
       "```bash\n"
       "jupyter-gpumem run examples/ci/train_budget.ipynb --budget 'peak<=2GiB' "
       "--budget 'kept<=512MiB' --fits 3GiB --html gpumem.html\n"
       "```\n\n"
       "The `--budget`s apply to every cell. A cell's own budgets are in its tags "
       "(`gpumem: peak<=1GiB`, shown in JupyterLab's property inspector); a cell's budget for "
       "a metric replaces the command line's for that cell."),
    code("import torch\n\ntorch.manual_seed(0)\ndevice = 'cuda'"),
    md("The model: ~64 MiB of float32 parameters. Creating it keeps exactly that."),
    tagged("model = torch.nn.Sequential(\n"
           "    torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048)\n"
           ").to(device)\n"
           "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)",
           "gpumem: kept<=128MiB"),
    md("A few training steps. AdamW's state (2 × the parameters) appears at the first step; "
       "activations and gradients peak inside the step and are freed after it."),
    tagged("for step in range(5):\n"
           "    x = torch.randn(4096, 2048, device=device)\n"
           "    loss = model(x).square().mean()\n"
           "    loss.backward()\n"
           "    opt.step()\n"
           "    opt.zero_grad(set_to_none=True)\n"
           "print(f'loss {loss.item():.4f}')",
           "gpumem: peak<=1GiB", "gpumem: kept<=256MiB"),
    md("Evaluation without a graph should keep nothing."),
    tagged("with torch.no_grad():\n"
           "    val = model(torch.randn(8192, 2048, device=device)).mean().item()\n"
           "val",
           "gpumem: kept<=0"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "examples/ci/train_budget.ipynb")
