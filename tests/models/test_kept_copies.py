"""What a backbone keeps between inference forwards (the weights' autocast casts, the gathered
relative position bias, SwinV2's continuous bias) never outlives a train() / eval().

Torch's FSDP writes gathered weights into the same storage without counting a write (FSDP2
preserves the version counter on purpose), so version and storage alone would serve the casts
of the weights before the last steps; ``.data`` writes do the same, deterministically, so they
stand in for it here. The reference is a fresh backbone loaded with the new weights.
"""
import pytest
import torch

from swin_rpe_plugin import SwinTransformer, SwinTransformerV2
from swin_rpe_plugin.ops.dispatch import force_backend

SMALL = dict(embed_dims=16, depths=(2, 2), num_heads=(2, 4), strides=(4, 2), window_size=4,
             out_indices=(0, 1),
             drop_path_rate=0.)


def build(cls):
    torch.manual_seed(0)
    model = cls(**SMALL)
    model.init_weights()
    return model.eval()


def infer(model, x, dtype):
    with torch.no_grad(), torch.autocast('cpu', dtype or torch.bfloat16,
                                         enabled=dtype is not None):
        return [o.float() for o in model(x)]


@pytest.mark.parametrize('backend', ['auto', 'generic'])
@pytest.mark.parametrize('dtype', [None, torch.bfloat16], ids=['fp32', 'bf16'])
@pytest.mark.parametrize('cls', [SwinTransformer, SwinTransformerV2], ids=['v1', 'v2'])
def test_weights_rewritten_without_a_version_bump_are_seen_after_train_eval(cls, dtype,
                                                                            backend):
    x = torch.randn(2, 3, 36, 44, generator=torch.Generator().manual_seed(1))
    with force_backend(backend):
        model = build(cls)
        before = infer(model, x, dtype)
        infer(model, x, dtype)  # kept from here on
        with torch.no_grad():
            for p in model.parameters():  # a write the version counter does not see
                p.data.copy_(p.data * 1.25 + 0.01)
        model.train()
        model.eval()
        after = infer(model, x, dtype)
        fresh = build(cls)
        fresh.load_state_dict(model.state_dict())
        expected = infer(fresh, x, dtype)
    for a, e, b in zip(after, expected, before):
        assert not torch.allclose(e, b)  # the rewrite changes the outputs
        torch.testing.assert_close(a, e, rtol=0, atol=0)
