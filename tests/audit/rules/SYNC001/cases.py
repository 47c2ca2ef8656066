"""SYNC001 fixtures: calls that wait for the device, and steps that do not."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch

from levers import Workload


def _workload(body, optimizer="sgd"):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=False)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step():
        y = model(x)
        loss = body(y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="sync001")


def fire_item():
    def body(y):
        scale = y.abs().max().item()  # mark: fire_item
        return y.pow(2).mean() / scale

    return _workload(body)


def fire_bool_branch():
    def body(y):
        if bool((y > 0).any()):  # mark: fire_bool_branch
            return y.pow(2).mean()
        return y.mean()

    return _workload(body)


def fire_bool_index():
    def body(y):
        return y[y > 0].sum()  # mark: fire_bool_index

    return _workload(body)


def fire_nonzero_in_loop():
    def body(y):
        total = y.sum() * 0
        for row in y:
            total = total + row[row.nonzero().squeeze(-1)].sum()  # mark: fire_nonzero_in_loop
        return total

    return _workload(body)


def ok_where():
    def body(y):
        return torch.where(y > 0, y, torch.zeros_like(y)).sum()

    return _workload(body)


def ok_adamw_step_counter():
    # AdamW's single-tensor step reads its CPU step counter with .item(): torch's own host state
    return _workload(lambda y: y.pow(2).mean(), optimizer="adamw")


def regress_repeat_interleave_with_output_size():
    def body(y):
        repeats = torch.tensor([1, 2, 1, 0])
        return y.repeat_interleave(repeats, dim=0, output_size=4).sum()

    return _workload(body)


class _Passthrough(torch.overrides.TorchFunctionMode):
    """Another torch-function mode around the step (Lightning's, a profiler's)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def ok_adamw_step_counter_under_another_mode():
    # the counter's .item() reaches the capture's handler through the other mode's handler
    # (defect N6, Lightning): still torch's own host state
    inner = _workload(lambda y: y.pow(2).mean(), optimizer="adamw")
    step = inner.step

    def step_in_mode():
        with _Passthrough():
            return step()

    return Workload(model=inner.model, step=step_in_mode, optimizer=inner.optimizer,
                    name="sync001")


class _Lengths(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        n = 4 + int(torch.randint(0, 4, (1,)))  # host tensors, in the data pipeline
        return torch.ones(8) * n


def ok_batch_made_by_a_dataloader():
    # a Dataset's reads of its own host tensors wait for no GPU (defect N6)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(torch.utils.data.DataLoader(_Lengths(), batch_size=4))

    def step():
        loss = model(next(batches)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="sync001")
