"""The toy compiled step the compile-cache tests run in fresh processes: a matmul, an
autocast-off region and a custom autograd.Function (what the drafter step holds). Source
text, pasted into each test's subprocess script (needs ``torch`` imported first)."""

TOY_STEP_SRC = r'''
class Sq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        with torch.autocast(device_type="cpu", enabled=False):
            return x.float() * x.float()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g

def step(x, w):
    h = x @ w
    with torch.autocast(device_type="cpu", enabled=False):
        h = torch.nn.functional.silu(h.float())
    return Sq.apply(h).sum()
'''
