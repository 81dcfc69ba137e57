"""``latecast train --graph``: one training step, data included (``Loader.fill``), captured
once in a CUDA graph and replayed; the SGD update reads the lr from a device tensor (a graph
would freeze a Python number) and keeps SGD's momentum buffers, so checkpoints stay SGD's."""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

from ..errors import ConfigError, DeviceError
from ..loader import Loader

WARMUP_STEPS = 3  # eager steps on a side stream before capture (cuDNN autotune, lazy init)


def nesterov_sgd(
    params: list[Tensor], buffers: list[Tensor], lr: Tensor, momentum: float, weight_decay: float
) -> None:
    """``torch.optim.SGD(nesterov=True)``'s update in place, ``lr`` a 0-dim device tensor:
    ``g = grad + wd*p; b = m*b + g; p -= lr * (g + m*b)``. Six multi-tensor kernels."""
    grads = torch._foreach_add([p.grad for p in params], params, alpha=weight_decay)
    torch._foreach_mul_(buffers, momentum)
    torch._foreach_add_(buffers, grads)
    torch._foreach_add_(grads, buffers, alpha=momentum)
    torch._foreach_mul_(grads, lr)
    torch._foreach_sub_(params, grads)


class GraphedStep:
    """The whole training step of ``model`` on ``loader``'s static resident batches, warmed
    up (its state put back), then ``capture``d once; each call replays it:
    ``for _ in loader.staged(): loss = step()``."""

    def __init__(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        sched: torch.optim.lr_scheduler.LRScheduler,
        loader: Loader,
        loss_fn: Callable[..., torch.Tensor],
        config,  # a resolved TrainConfig: label_smoothing and amp
    ) -> None:
        (group,) = opt.param_groups  # one group, as model_and_optimizer makes it
        if not group["nesterov"] or group["dampening"]:
            raise ConfigError("--graph implements SGD with Nesterov momentum, no dampening")
        self.model, self.opt, self.sched, self.loader = model, opt, sched, loader
        self.loss_fn, self.config, self.group = loss_fn, config, group
        self.params = [p for p in group["params"] if p.requires_grad]
        # torch.optim.SGD makes a momentum buffer at its first step, a copy of the gradient;
        # a zero buffer gives the same first step (0*m + g == g) and a fixed address.
        for p in self.params:
            if opt.state[p].get("momentum_buffer") is None:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        self.buffers = [opt.state[p]["momentum_buffer"] for p in self.params]
        self.lr = torch.tensor(float(group["lr"]), device=loader.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.loss: torch.Tensor | None = None
        self._warm_up()

    def body(self) -> torch.Tensor:
        """One step, all device work: fill the batch, loss, backward, update. The loss."""
        images, labels = self.loader.fill()
        c = self.config
        loss = self.loss_fn(self.model, images, labels, c.label_smoothing, c.amp)
        loss.backward()
        with torch.no_grad():
            momentum, decay = self.group["momentum"], self.group["weight_decay"]
            nesterov_sgd(self.params, self.buffers, self.lr, momentum, decay)
        return loss.detach()

    def _warm_up(self) -> None:
        """``WARMUP_STEPS`` eager steps on a side stream, then the state put back in place."""
        saved = {k: v.clone() for k, v in self.model.state_dict().items()}
        buffers = [b.clone() for b in self.buffers]
        side = torch.cuda.Stream(self.loader.device)
        side.wait_stream(torch.cuda.current_stream(self.loader.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.model.zero_grad(set_to_none=True)
                self.body()
        torch.cuda.current_stream(self.loader.device).wait_stream(side)
        self.model.load_state_dict(saved)  # copies in place
        for b, s in zip(self.buffers, buffers):
            b.copy_(s)

    def capture(self) -> None:
        """Record ``body`` once. Gradients are set to None first, so the captured backward
        writes them fresh (from the graph's own memory) on every replay."""
        graph = torch.cuda.CUDAGraph()
        if self.loader.augment is not None:  # draws come from the Prepare stage's generator
            if not hasattr(graph, "register_generator_state"):
                raise DeviceError(
                    f"--graph with augmentation needs CUDAGraph.register_generator_state, "
                    f"which torch {torch.__version__} lacks; use --augment none or a newer torch"
                )
            graph.register_generator_state(self.loader.prepare.generator(self.loader.device))
        self.model.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            self.loss = self.body()
        self.graph = graph

    def __call__(self, images: torch.Tensor | None = None, labels=None) -> torch.Tensor:
        """Replay one step on the batch ``Loader.staged`` staged (arguments ignored); the loss."""
        self.lr.fill_(self.group["lr"])  # a kernel with the value as argument: no sync
        self.graph.replay()
        with warnings.catch_warnings():  # torch warns once of "lr_scheduler.step() before
            warnings.simplefilter("ignore")  # optimizer.step()": it did step, in the graph
            self.sched.step()
        return self.loss
