"""The scenarios of tests/gpu/test_free_gpu.py (``%gpumem free`` on a GPU): each one a list
of cells run one by one in a fresh ipykernel, as a user would, that leaves a model's GPU
memory held the way users get into it; then a cell that measures the truth independently,
the free itself, and cells that check what must not have changed.

Two halves in one module:

- the driver (:func:`run`, in the test's process): starts a kernel over jupyter_client,
  runs the cells, collects what the kernel printed after :data:`MARK` (one JSON object a
  line) and each cell's execution count, and shuts the kernel down;
- the kernel side (:func:`truth`, :func:`free_and_measure`, :func:`emit`,
  :func:`tiny_tokenizer`...), imported inside the kernel as ``fc``. It keeps no reference
  to anything it measures: each function returns plain numbers (a reference left in this
  module would itself hold the memory the test frees).

Every cell refers to the device as ``dev`` (``"cuda"`` in the test); nothing is downloaded:
models are built from configs, the tokenizer from a word list.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[2])
MARK = "@@free-case@@ "
MiB = 1 << 20
# The control tensor every scenario keeps: 16 MiB, a whole number of 2 MiB pages above the
# allocator's 10 MiB "large" threshold, so that it gets a segment of its own (no free tail
# that a model's parameters could be placed in, which would keep them from the driver).
KEEP_N = 4 << 20  # float32 elements: 16 MiB


# -- the cells ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    label: str
    code: str
    error: bool = False  # the cell is meant to raise (a forward that fails)


@dataclass(frozen=True)
class Scenario:
    """One way of holding a model's memory, and what ``free`` is asked to let go of."""

    name: str
    cells: tuple[Cell, ...]
    names: tuple[str, ...]  # what %gpumem free is given
    # Python expressions (in the kernel, before the free): the objects the named ones are
    # (their own storages: what the report's ``held`` must count) and everything the user
    # expects back with them (``owner``: the optimizer's state too, a library's buffers)
    named: str
    owner: str
    post: tuple[Cell, ...] = ()  # after the free: checks that print with fc.emit
    timeout: float = 240.0
    files: dict[str, str] = field(default_factory=dict)  # written under the scenario's folder


def _c(label: str, code: str, error: bool = False) -> Cell:
    return Cell(label, textwrap.dedent(code).strip("\n"), error)


def prelude(device: str) -> tuple[Cell, ...]:
    return (
        _c("load", "%load_ext jupyter_gpumem"),
        _c(
            "setup",
            f"""
            import gc, json, sys
            sys.path.insert(0, {ROOT!r})
            import torch
            import jupyter_gpumem
            from tests.gpu import free_cases as fc
            dev = {device!r}
            keep = torch.arange({KEEP_N}, device=dev, dtype=torch.float32)
            keep_cpu = keep.cpu()
            keep_ptr = keep.data_ptr()
            """,
        ),
    )


GPT2 = """
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4)).to(dev)
"""  # 67.7 M parameters: 258 MiB in float32 (GPT-2's vocabulary, four layers)


def finale(sc: Scenario) -> tuple[Cell, ...]:
    """The truth before, the free, the controls, the scenario's own checks."""
    names = list(sc.names)
    return (
        _c("truth", f"fc.truth(named=[{sc.named}], owner=[{sc.owner}])"),
        _c("free", f"fc.free_and_measure({names!r})"),
        _c(
            "controls",
            """
            fc.emit(
                "controls",
                keep_present="keep" in dir(),
                keep_same_storage=keep.data_ptr() == keep_ptr,
                keep_equal=bool(torch.equal(keep.cpu(), keep_cpu)),
            )
            """,
        ),
        *sc.post,
    )


# -- the scenarios -----------------------------------------------------------------------
def scenarios() -> dict[str, Scenario]:
    out = [
        Scenario(
            "out_history",
            (
                _c(
                    "model",
                    GPT2 + "alias = model  # another name\nwte = model.transformer.wte  # a part\n",
                ),
                _c("show", "model"),  # Out[n], _n and _
                _c("count", "n_params = sum(p.numel() for p in model.parameters())\nn_params"),
                _c("show_again", "model.eval()"),  # Out[m], _m, _ (and ___ from the first)
                _c(
                    "dry",
                    """
                    before_dry = (torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0])
                    %gpumem free model --dry
                    fc.emit(
                        "dry",
                        allocated=torch.cuda.memory_allocated() - before_dry[0],
                        driver_free=torch.cuda.mem_get_info()[0] - before_dry[1],
                        model_left="model" in dir(),
                    )
                    """,
                ),
            ),
            ("model",),
            named="model",
            owner="model",
            post=(
                _c(
                    "after",
                    """
                    fc.emit(
                        "after",
                        out_keys=sorted(Out),
                        underscores=[type(x).__name__ for x in (_, __, ___)],
                        n_params=n_params,
                        model_left="model" in dir(),
                    )
                    """,
                ),
            ),
        ),
        Scenario(
            "unnamed_output",
            (
                # never assigned: only Out[n], _n and _ hold it; freed by the name `_`
                _c(
                    "show",
                    """
                    from transformers import GPT2Config, GPT2LMHeadModel
                    torch.manual_seed(0)
                    GPT2LMHeadModel(GPT2Config(n_layer=4)).to(dev)
                    """,
                ),
            ),
            ("_",),
            named="_",
            owner="_",
            post=(_c("after", "fc.emit('after', out_keys=sorted(Out), underscore=repr(_))"),),
        ),
        Scenario(
            "traceback",
            (
                _c("model", GPT2),
                _c(
                    "data",
                    """
                    ids = torch.randint(0, 50257, (2, 256), device=dev)
                    bad = torch.randint(0, 50257, (1, 256), device=dev)  # a batch of one
                    ids_cpu, bad_cpu = ids.cpu(), bad.cpu()

                    def train_step(model, ids, labels):
                        out = model(input_ids=ids, labels=labels)
                        return out.loss
                    """,
                ),
                # the loss compares 2 x 255 predictions with 1 x 255 labels and raises,
                # after the whole forward: the traceback keeps its frames' activations
                _c("fail", "loss = train_step(model, ids, bad)", error=True),
                _c(
                    "before",
                    "fc.emit('before', has_traceback=hasattr(sys, 'last_traceback'))",
                ),
            ),
            ("model",),
            named="model",
            owner="model",
            post=(
                _c(
                    "after",
                    """
                    fc.emit(
                        "after",
                        has_traceback=hasattr(sys, "last_traceback"),
                        ids_equal=bool(torch.equal(ids.cpu(), ids_cpu)),
                        bad_equal=bool(torch.equal(bad.cpu(), bad_cpu)),
                    )
                    """,
                ),
            ),
        ),
        Scenario(
            "optimizer_graph",
            (
                _c("model", GPT2),
                _c(
                    "train",
                    """
                    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
                    total_loss = 0
                    for step in range(3):
                        ids = torch.randint(0, 50257, (2, 256), device=dev)
                        loss = model(input_ids=ids, labels=ids).loss
                        loss.backward()
                        opt.step()
                        opt.zero_grad()
                        total_loss = total_loss + loss  # no .item(): each loss's graph is kept
                    """,
                ),
                _c(
                    "evaluate",
                    """
                    for step in range(2):  # an evaluation that forgot no_grad() and .item()
                        ids = torch.randint(0, 50257, (2, 256), device=dev)
                        val = model(input_ids=ids, labels=ids).loss
                        total_loss = total_loss + val
                    """,
                ),
                _c("mean", "total_loss / 5"),  # Out[n]: a tensor with the whole graph
                _c(
                    "before",
                    """
                    fc.emit(
                        "before",
                        total_loss=total_loss.item(),
                        requires_grad=total_loss.requires_grad,
                    )
                    total_value = total_loss.item()
                    """,
                ),
            ),
            ("model",),
            named="model",
            owner="model, opt",
            post=(
                _c(
                    "after",
                    """
                    fc.emit(
                        "after",
                        total_loss_present="total_loss" in dir(),
                        total_loss=total_loss.item(),
                        total_value=total_value,
                        total_on_device=total_loss.device.type == dev,
                        grad_fn=total_loss.grad_fn is None,
                        requires_grad=total_loss.requires_grad,
                        opt_left="opt" in dir(),
                        val_grad_fn=val.grad_fn is None,
                        loss_grad_fn=loss.grad_fn is None,
                    )
                    """,
                ),
            ),
        ),
        Scenario(
            "pipeline",
            (
                _c("model", GPT2),
                _c(
                    "pipe",
                    """
                    from transformers import pipeline
                    tok = fc.tiny_tokenizer()
                    pipe = pipeline("text-generation", model=model, tokenizer=tok, device=dev)
                    outputs = pipe(["hello world", "the gpu"], max_new_tokens=8, do_sample=False)
                    len(outputs)
                    """,
                ),
            ),
            ("pipe",),
            named="pipe.model",
            owner="pipe.model",
            post=(
                _c(
                    "after",
                    """
                    fc.emit(
                        "after",
                        pipe_left="pipe" in dir(),
                        model_left="model" in dir(),
                        outputs=len(outputs),
                        tok_left="tok" in dir(),
                    )
                    """,
                ),
            ),
        ),
        _trainer("trainer", ("trainer",)),
        _trainer("trainer_model", ("model",)),
        Scenario(
            "accelerate",
            (
                _c(
                    "accelerator",
                    """
                    from accelerate import Accelerator
                    accelerator = Accelerator()
                    """,
                ),
                _c(
                    "model",
                    GPT2
                    + "opt = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
                    + "model, opt = accelerator.prepare(model, opt)\n",
                ),
                _c(
                    "step",
                    """
                    ids = torch.randint(0, 50257, (2, 256), device=accelerator.device)
                    loss = model(input_ids=ids, labels=ids).loss
                    accelerator.backward(loss)
                    opt.step()
                    opt.zero_grad()
                    """,
                ),
            ),
            ("model", "opt"),
            named="model, opt",
            owner="model, opt",
            post=(
                _c(
                    "after",
                    """
                    lists = (len(accelerator._models), len(accelerator._optimizers))
                    again = accelerator.prepare(torch.nn.Linear(8, 8))  # still usable
                    fc.emit(
                        "after",
                        accelerator_left="accelerator" in dir(),
                        models=lists[0],
                        optimizers=lists[1],
                        prepared_again=next(again.parameters()).device.type == dev,
                        loss_grad_fn=loss.grad_fn is None,
                    )
                    """,
                ),
            ),
        ),
        Scenario(
            "kept_by_dict",
            (
                _c(
                    "other",
                    # 16 MiB, before the model: a segment of its own (see KEEP_N)
                    """
                    other = torch.full(({KEEP_N},), 7.0, device=dev)
                    other_ptr = other.data_ptr()
                    """.replace("{KEEP_N}", str(KEEP_N)),
                ),
                _c("model", GPT2),
                _c("results", "results = {'model': model, 'other': other}"),
            ),
            ("model",),
            named="model",
            owner="model",
            post=(
                _c(
                    "after",
                    """
                    fc.emit(
                        "after",
                        results_keys=sorted(results),
                        results_model=type(results["model"]).__name__,
                        other_present="other" in dir(),
                        other_same=other.data_ptr() == other_ptr
                        and results["other"] is other,
                        other_equal=bool((other == 7.0).all()),
                    )
                    """,
                ),
            ),
        ),
        Scenario(
            "hook",
            (
                _c("model", GPT2),
                _c(
                    "student",
                    # Linear(2048, 2048): a 16 MiB weight, a segment of its own (see KEEP_N)
                    """
                    student = torch.nn.Linear(2048, 2048).to(dev)
                    student_cpu = student.weight.detach().cpu()
                    shapes = []
                    count_handle = student.register_forward_hook(
                        lambda mod, inputs, output: shapes.append(tuple(output.shape))
                    )

                    def distill_from(teacher, module):
                        def hook(mod, inputs, output):
                            with torch.no_grad():
                                teacher.transformer.h[0].mlp(output[..., :768])
                        return module.register_forward_hook(hook)

                    handle = distill_from(model, student)
                    y = student(torch.randn(2, 2048, device=dev))
                    del y
                    """,
                ),
            ),
            ("model",),
            named="model",
            owner="model",
            post=(
                _c(
                    "after",
                    """
                    with torch.no_grad():
                        student(torch.randn(2, 2048, device=dev))
                    fc.emit(
                        "after",
                        hooks=len(student._forward_hooks),
                        shapes=len(shapes),
                        student_equal=bool(torch.equal(student.weight.detach().cpu(), student_cpu)),
                    )
                    """,
                ),
            ),
        ),
        Scenario(
            "thread",
            (
                _c("model", GPT2),
                _c(
                    "thread",
                    """
                    import threading
                    stop = threading.Event()

                    def serve(model, stop):  # a server thread: the model is its local
                        stop.wait()
                        return model.config.n_layer

                    server = threading.Thread(
                        target=serve, args=(model, stop), name="loader", daemon=True
                    )
                    server.start()
                    """,
                ),
            ),
            ("model",),
            named="model",
            owner="model",
            post=(
                _c(
                    "release",
                    """
                    stop.set()
                    server.join(10)
                    fc.emit("release", alive=server.is_alive(), **fc.collect())
                    """,
                ),
            ),
        ),
        Scenario(
            "vllm_standin",
            (
                _c(
                    "llm",
                    """
                    sys.path.insert(0, CASE_DIR)
                    from vllm import LLM
                    llm = LLM(model="tiny-gpt2", device=dev)
                    outputs = llm.generate(["hello world"])
                    import vllm.distributed.parallel_state as ps
                    """,
                ),
            ),
            ("llm",),
            named="llm.llm_engine.model_executor.driver_worker.model_runner",
            owner=(
                "llm.llm_engine.model_executor.driver_worker.model_runner, "
                "ps._WORLD.buffer, ps._TP.buffer"
            ),
            post=(
                _c(
                    "after",
                    """
                    fc.emit(
                        "after",
                        calls=list(ps.CALLS),
                        world=ps._WORLD is None,
                        tp=ps._TP is None,
                        llm_left="llm" in dir(),
                    )
                    """,
                ),
            ),
            files=VLLM_STANDIN,
        ),
    ]
    return {s.name: s for s in out}


def _trainer(name: str, names: tuple[str, ...]) -> Scenario:
    return Scenario(
        name,
        (
            _c("model", GPT2),
            _c(
                "trainer",
                """
                import tempfile
                from transformers import Trainer, TrainingArguments

                class RandomTokens(torch.utils.data.Dataset):
                    def __init__(self, n=32, seq=128):
                        g = torch.Generator().manual_seed(0)
                        self.ids = torch.randint(0, 50257, (n, seq), generator=g)

                    def __len__(self):
                        return len(self.ids)

                    def __getitem__(self, i):
                        return {"input_ids": self.ids[i], "labels": self.ids[i]}

                args = TrainingArguments(
                    output_dir=tempfile.mkdtemp(),
                    max_steps=4,
                    per_device_train_batch_size=4,
                    report_to=[],
                    save_strategy="no",
                    logging_strategy="no",
                    disable_tqdm=True,
                    dataloader_num_workers=0,
                    use_cpu=dev == "cpu",
                )
                trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())
                """,
            ),
            _c("train", "trainer.train()"),  # Out[n]: the TrainOutput (numbers only)
        ),
        names,
        named="trainer.model, trainer.optimizer" if "trainer" in names else "model",
        owner="trainer.model, trainer.optimizer",
        post=(
            _c(
                "after",
                """
                fc.emit(
                    "after",
                    trainer_left="trainer" in dir(),
                    model_left="model" in dir(),
                    args_left="args" in dir(),
                )
                """,
            ),
        ),
    )


# -- the vLLM stand-in ---------------------------------------------------------------------
# vLLM is not installed on the GPU machine: a package named ``vllm`` that holds GPU memory
# the way vLLM's offline ``LLM`` does (the model and its paged KV cache in the engine's
# executor, buffers of the distributed state in module globals of
# ``vllm.distributed.parallel_state``, cleared only by its destroy functions), written
# into the scenario's folder and put on the kernel's sys.path.
VLLM_STANDIN = {
    "vllm/__init__.py": '''
        """A stand-in for vLLM (tests/gpu/free_cases.py): not vLLM."""
        from .entrypoints.llm import LLM

        __all__ = ["LLM"]
        ''',
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/llm.py": """
        import torch

        from ..distributed import parallel_state


        class ModelRunner:
            def __init__(self, device, n_layer, num_gpu_blocks, block_size=16):
                from transformers import GPT2Config, GPT2LMHeadModel

                torch.manual_seed(0)
                cfg = GPT2Config(n_layer=n_layer)
                self.model = GPT2LMHeadModel(cfg).to(device).eval()
                head = cfg.n_embd // cfg.n_head
                # the paged KV cache, one tensor a layer: (K/V, blocks, block size, heads, dim)
                self.kv_caches = [
                    torch.zeros(2, num_gpu_blocks, block_size, cfg.n_head, head, device=device)
                    for _ in range(n_layer)
                ]


        class Worker:
            def __init__(self, device, **kw):
                self.model_runner = ModelRunner(device, **kw)


        class Executor:
            def __init__(self, device, **kw):
                self.driver_worker = Worker(device, **kw)

            def shutdown(self):
                parallel_state.CALLS.append("executor.shutdown")


        class LLMEngine:
            def __init__(self, device, **kw):
                parallel_state.init_distributed_environment(device)
                self.model_executor = Executor(device, **kw)


        class LLM:
            def __init__(self, model, device="cuda", n_layer=4, num_gpu_blocks=64):
                self.model_name = model
                self.llm_engine = LLMEngine(device, n_layer=n_layer, num_gpu_blocks=num_gpu_blocks)

            def generate(self, prompts, max_tokens=4):
                runner = self.llm_engine.model_executor.driver_worker.model_runner
                device = next(runner.model.parameters()).device
                with torch.inference_mode():
                    ids = torch.randint(0, 50257, (len(prompts), 8), device=device)
                    for _ in range(max_tokens):
                        nxt = runner.model(input_ids=ids).logits[:, -1].argmax(-1)
                        ids = torch.cat([ids, nxt[:, None]], dim=1)
                return [" ".join(map(str, row)) for row in ids.tolist()]
        """,
    "vllm/distributed/__init__.py": """
        from . import parallel_state
        from .parallel_state import destroy_distributed_environment, destroy_model_parallel

        __all__ = ["destroy_distributed_environment", "destroy_model_parallel", "parallel_state"]
        """,
    "vllm/distributed/parallel_state.py": '''
        """Module-level distributed state, as vLLM keeps it: groups whose communicators
        hold device buffers, dropped only by the destroy functions."""
        import torch

        CALLS = []
        _WORLD = None
        _TP = None


        class GroupCoordinator:
            def __init__(self, name, device, nbytes):
                self.unique_name = name
                # what the group's communicators keep on the device (all-reduce buffers)
                self.buffer = torch.zeros(nbytes, dtype=torch.uint8, device=device)


        def init_distributed_environment(device):
            global _WORLD, _TP
            _WORLD = GroupCoordinator("world", device, 16 << 20)
            _TP = GroupCoordinator("tp", device, 16 << 20)


        def destroy_model_parallel():
            global _TP
            CALLS.append("destroy_model_parallel")
            _TP = None


        def destroy_distributed_environment():
            global _WORLD
            CALLS.append("destroy_distributed_environment")
            _WORLD = None
        ''',
}


def write_files(files: dict[str, str], where: Path) -> None:
    for rel, text in files.items():
        p = where / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


# -- the driver (the test's process) --------------------------------------------------------
@dataclass
class Outcome:
    """What a scenario's kernel said: the emitted objects by tag, each cell's execution
    count and status, and the text it printed (for failure messages)."""

    emitted: dict[str, dict[str, Any]]
    counts: dict[str, int]
    status: dict[str, str]
    errors: dict[str, str]
    text: dict[str, str]

    def log(self) -> str:
        parts = []
        for label, t in self.text.items():
            parts.append(f"--- [{label}] {self.status.get(label)}\n{t[-3000:]}")
        return "\n".join(parts)


def kernel_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JUPYTER_GPUMEM_REPLAY", "JUPYTER_GPUMEM_BACKEND")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    # nothing is downloaded: fail at once rather than wait on a network that is not there
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def run(
    sc: Scenario,
    where: Path,
    device: str = "cuda",
    last: tuple[Cell, ...] | None = None,
) -> Outcome:
    """Run ``sc`` in a fresh kernel: the prelude, its cells, then ``last`` (by default the
    truth, the free and the checks)."""
    from jupyter_client.manager import KernelManager

    where.mkdir(parents=True, exist_ok=True)
    write_files(sc.files, where)
    cells = (*prelude(device), *sc.cells, *(finale(sc) if last is None else last))
    out = Outcome({}, {}, {}, {}, {})
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=kernel_env(), cwd=str(where))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        for cell in cells:
            code = cell.code.replace("CASE_DIR", repr(str(where)))
            chunks: list[str] = []

            def hook(msg: dict, chunks: list[str] = chunks) -> None:
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    chunks.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    chunks.append(content["data"].get("text/plain", "") + "\n")
                elif kind == "error":
                    chunks.append("\n".join(content["traceback"]) + "\n")

            reply = kc.execute_interactive(
                code, timeout=sc.timeout, output_hook=hook, stop_on_error=False
            )
            content = reply["content"]
            text = "".join(chunks)
            out.text[cell.label] = text
            out.status[cell.label] = content["status"]
            out.counts[cell.label] = content.get("execution_count")
            if content["status"] == "error":
                out.errors[cell.label] = f"{content['ename']}: {content['evalue']}"
            for line in text.splitlines():
                if line.startswith(MARK):
                    obj = json.loads(line[len(MARK) :])
                    out.emitted[obj.pop("tag")] = obj
            if content["status"] != "ok" and not cell.error:
                break  # the cells after it would only fail the same way
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return out


# -- the kernel side ------------------------------------------------------------------------
def emit(tag: str, **values: Any) -> None:
    """One line the driver reads: ``MARK {"tag": ..., ...}``."""
    print(MARK + json.dumps({"tag": tag, **values}, default=str), flush=True)


def tiny_tokenizer() -> Any:
    """A word-level tokenizer made here (no download): enough for a pipeline to run."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "hello", "world", "the", "gpu", *(f"w{i}" for i in range(58))]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>"
    )


def _device_type() -> str:
    main = sys.modules.get("__main__")
    return str(getattr(main, "dev", "cuda"))


def storages(objs: list[Any]) -> dict[int, int]:
    """data_ptr -> nbytes of the distinct storages, on the scenario's device, of: a module's
    parameters, buffers and gradients; an optimizer's state; a tensor; the values of an
    object's attributes and of lists (a model runner and its KV cache). Found by torch's
    own API, not by the walk under test."""
    import torch

    device = _device_type()
    out: dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == device:
            s = t.untyped_storage()
            if s.data_ptr() and s.nbytes():
                out[s.data_ptr()] = s.nbytes()

    def visit(o: Any, depth: int = 0) -> None:
        if isinstance(o, torch.Tensor):
            add(o)
            add(o.grad)
        elif isinstance(o, torch.nn.Module):
            for p in o.parameters():
                add(p)
                add(p.grad)
            for b in o.buffers():
                add(b)
        elif isinstance(o, torch.optim.Optimizer):
            for st in o.state.values():
                for v in st.values():
                    add(v)
            for g in o.param_groups:
                for p in g["params"]:
                    add(p)
                    add(p.grad)
        elif isinstance(o, (list, tuple)) and depth < 3:
            for x in o:
                visit(x, depth + 1)
        elif hasattr(o, "__dict__") and depth < 3:
            for x in vars(o).values():
                visit(x, depth + 1)

    for o in objs:
        visit(o)
    return out


def _blocks() -> dict[int, int]:
    """address -> size of every live block, from torch's own snapshot of the allocator."""
    import torch

    if _device_type() != "cuda":
        return {}
    out: dict[int, int] = {}
    for seg in torch.cuda.memory_snapshot():
        address = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out[b.get("address", address)] = b["size"]
            address += b["size"]
    return out


def _figures(objs: list[Any]) -> dict[str, int]:
    s = storages(objs)
    blocks = _blocks()
    return {
        "bytes": sum(s.values()),  # the storages' own sizes
        "rounded": sum(-(-n // 512) * 512 for n in s.values()),  # each to 512 B
        "large": sum(1 for n in s.values() if n > MiB),  # from the allocator's large pool
        "blocks": sum(blocks.get(p, 0) for p in s),  # the allocator's blocks for them
        "missing": sum(1 for p in s if p not in blocks),  # storages that start no block
        "count": len(s),
    }


def truth(named: list[Any], owner: list[Any]) -> None:
    """The figures measured with torch alone before the free: the named objects' storages
    and the owner's (the named ones and what comes with them), in bytes and in allocator
    blocks. Emits them; keeps nothing."""
    emit("truth", named=_figures(named), owner=_figures(owner))


def _driver() -> dict[str, int]:
    import torch

    if _device_type() != "cuda":
        return {"allocated": 0, "reserved": 0, "driver_free": 0}
    torch.cuda.synchronize()
    return {
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "driver_free": torch.cuda.mem_get_info()[0],
    }


def free_and_measure(names: list[str]) -> None:
    """``jupyter_gpumem.free(*names)`` between two independent readings (cudaMemGetInfo,
    the allocator's counters); emits the report's figures, its text and the readings."""
    from dataclasses import asdict

    import jupyter_gpumem
    from jupyter_gpumem.reporters.free import free_lines

    before = _driver()
    try:
        r = jupyter_gpumem.free(*names)
    except Exception as e:  # said in the emitted object, so the test shows why
        emit("free", error=f"{type(e).__name__}: {e}", before=before, after=_driver())
        return
    after = _driver()
    text = "\n".join(free_lines(r))
    print(text, flush=True)
    emit(
        "free",
        report=asdict(r),
        held=r.held,
        expected_returned=r.expected_returned,
        returned=r.returned,
        text=text,
        before=before,
        after=after,
    )


def collect() -> dict[str, int]:
    """After a holder went away by itself: collect, give the cache back, read again."""
    import gc

    import torch

    gc.collect()
    if _device_type() == "cuda":
        torch.cuda.empty_cache()
    return _driver()
