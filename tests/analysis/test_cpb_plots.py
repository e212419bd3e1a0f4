"""SwinV2 analysis: the CPB surfaces against the model's own bias, the V2 complexity count
against the published SwinV2-T figures, the query-attention picture on a V2 block."""
import torch
import torch.nn.functional as F

from swin_rpe_plugin import SwinTransformerV2
from swin_rpe_plugin.analysis import build_classifier, count_complexity
from swin_rpe_plugin.analysis.cpb_plots import cpb_surfaces, plot_cpb_surfaces
from swin_rpe_plugin.analysis.rpe_plots import close, query_attention


def tiny_v2(window=6, pretrained=4):
    torch.manual_seed(0)
    model = SwinTransformerV2(embed_dims=16, depths=(2, 2), num_heads=(2, 4),
                              strides=(4, 2), out_indices=(0, 1), window_size=window,
                              pretrained_window_size=pretrained).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model


def test_surfaces_are_the_bias_the_block_adds_and_nest():
    model = tiny_v2()
    data = cpb_surfaces(model, 1, 1)
    assert data['pretrained'].shape == (4, 7, 7) and data['window'].shape == (4, 11, 11)
    # the offsets the pretrained window has sit at the same coordinates in the larger window
    assert torch.allclose(data['window'][:, 2:9, 2:9], data['pretrained'], atol=1e-6)
    msa = model.stages[1].blocks[1].attn.w_msa
    table = data['window'].reshape(4, -1).t()
    expected = table[msa.relative_position_index.reshape(-1)].reshape(36, 36, 4).permute(2, 0, 1)
    assert torch.allclose(msa.relative_position_bias(), expected, atol=1e-6)


def test_plot_has_a_panel_per_head_and_window(tmp_path):
    fig = plot_cpb_surfaces(tiny_v2(), 0, str(tmp_path / 'cpb.png'))
    assert (tmp_path / 'cpb.png').stat().st_size > 0
    assert len([ax for ax in fig.axes if ax.get_images()]) == 2 * 2  # 2 heads x 2 windows
    close(fig)


def test_query_attention_uses_cosine_attention_on_v2():
    model = tiny_v2()
    image = torch.randn(1, 3, 48, 48)
    block = model.stages[0].blocks[0]  # unshifted: query (5, 5) is token 35 of window 0
    captured = {}
    handle = block.register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    data = query_attention(model, image, 0, 0, 1, (5, 5))
    handle.remove()
    msa = block.attn.w_msa
    x = captured['x'].view(12, 12, 16)[:6, :6].reshape(36, 16)  # no pre-norm in V2
    bias = torch.cat([msa.q_bias, torch.zeros_like(msa.v_bias), msa.v_bias])
    q, k, _ = F.linear(x, msa.qkv.weight, bias).view(36, 3, 2, 8).unbind(1)
    cos = F.normalize(q[:, 1], dim=-1) @ F.normalize(k[:, 1], dim=-1).t()
    scale = msa.logit_scale[1].clamp(max=torch.log(torch.tensor(100.0))).exp()
    with torch.no_grad():
        expected = (cos * scale + msa.relative_position_bias()[1]).softmax(-1)[35]
        without = (cos * scale).softmax(-1)[35]
    assert torch.allclose(data['window_probs'][0], expected, atol=1e-5)
    assert torch.allclose(data['window_probs'][1], without, atol=1e-5)


def test_v2_tiny_complexity_matches_the_published_figures():
    model = build_classifier('v2-tiny')
    result = count_complexity(model, (torch.zeros(1, 3, 256, 256),), model.backbone,
                              'backbone.', (256, 256))
    assert abs(result['params'] / 1e6 / 28.3 - 1) < 0.02  # SwinV2-T: 28.3 M, 5.9 G at 256
    assert abs(result['flops'] / 1e9 / 5.9 - 1) < 0.02
