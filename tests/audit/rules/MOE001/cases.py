"""MOE001 fixtures: a small mixture of experts written as transformers writes its experts (class
name ending in ``Experts``, the weights of 4 experts stacked in 3-D parameters), run as the
eager loop over the experts (fires, naming no lever: the code is the user's) and as grouped
matmuls (``torch._grouped_mm``: quiet); experts as an ``nn.ModuleList`` named ``experts``,
looped over (fires, no lever); a dense MLP (quiet); the zoo's tiny Hugging Face Mixtral
set to ``experts_implementation="eager"`` (regress: names lever experts-grouped-mm, its
receipts in transformers' modeling_mixtral.py) and left at its default, grouped_mm (quiet)."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload

NUM_EXPERTS, TOP_K, HIDDEN, INTER = 4, 2, 32, 64


class LoopExperts(torch.nn.Module):
    """transformers' eager experts: one matmul per expert that got tokens, and projection."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(NUM_EXPERTS, 2 * INTER, HIDDEN) * 0.05)
        self.down_proj = torch.nn.Parameter(torch.randn(NUM_EXPERTS, HIDDEN, INTER) * 0.05)

    def forward(self, x, top_k_index, top_k_weights):
        out = torch.zeros_like(x)
        with torch.no_grad():
            mask = F.one_hot(top_k_index, NUM_EXPERTS).permute(2, 1, 0)
            hit = (mask.sum(dim=(-1, -2)) > 0).nonzero()
        for expert in hit:
            e = expert[0]
            pos, tok = torch.where(mask[e])
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)  # mark: fire_experts_loop
            h = F.linear(F.silu(gate) * up, self.down_proj[e])
            out.index_add_(0, tok, h * top_k_weights[tok, pos, None])
        return out


class GroupedExperts(LoopExperts):
    """The same experts as grouped matmuls: tokens sorted by expert, one kernel a projection."""

    def forward(self, x, top_k_index, top_k_weights):
        flat = top_k_index.reshape(-1)
        order = flat.argsort(stable=True)
        tok = order // TOP_K
        offs = torch.bincount(flat, minlength=NUM_EXPERTS).cumsum(0).to(torch.int32)
        gate, up = torch._grouped_mm(x[tok], self.gate_up_proj.transpose(1, 2), offs=offs).chunk(2, dim=-1)
        h = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(1, 2), offs=offs)
        h = h * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, tok, h)


class ListMoE(torch.nn.Module):
    """Experts as an nn.ModuleList of MLPs, looped over (transformers 4's Mixtral wrote them so)."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(HIDDEN, NUM_EXPERTS, bias=False)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(HIDDEN, INTER), torch.nn.SiLU(), torch.nn.Linear(INTER, HIDDEN))
            for _ in range(NUM_EXPERTS)
        )

    def forward(self, x):
        weights, index = self.router(x).softmax(-1).topk(TOP_K, dim=-1)
        out = x.clone()
        for e, expert in enumerate(self.experts):
            tok, pos = torch.where(index == e)
            out = out.index_add(0, tok, expert(x[tok]) * weights[tok, pos, None])  # mark: fire_module_list
        return out


class MoE(torch.nn.Module):
    def __init__(self, experts):
        super().__init__()
        self.router = torch.nn.Linear(HIDDEN, NUM_EXPERTS, bias=False)
        self.experts = experts

    def forward(self, x):
        weights, index = self.router(x).softmax(-1).topk(TOP_K, dim=-1)
        return x + self.experts(x, index, weights)


def _workload(model):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, HIDDEN)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="moe001")


def fire_experts_loop():
    torch.manual_seed(0)
    return _workload(torch.nn.Sequential(MoE(LoopExperts()), MoE(LoopExperts())))


def fire_module_list():
    torch.manual_seed(0)
    return _workload(torch.nn.Sequential(ListMoE(), ListMoE()))


def ok_grouped_experts():
    torch.manual_seed(0)
    return _workload(torch.nn.Sequential(MoE(GroupedExperts()), MoE(GroupedExperts())))


def ok_dense():
    torch.manual_seed(0)
    return _workload(torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, INTER), torch.nn.SiLU(), torch.nn.Linear(INTER, HIDDEN),
    ))


def _mixtral(implementation):
    from levers.workloads.zoo import build

    workload = build(model="mixtral")
    workload.model.set_experts_implementation(implementation)
    return workload


def regress_hf_mixtral_eager():
    return _mixtral("eager")


def ok_hf_mixtral_grouped():
    return _mixtral("grouped_mm")
