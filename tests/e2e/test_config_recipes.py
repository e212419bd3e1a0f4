"""Every config in configs/ loads, builds through its toolkit's registry, and its optimiser wrapper
gives zero weight decay to exactly the parameters the Swin recipe names."""
import glob
import importlib
import os

import pytest
import torch
from mmengine.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, 'configs', '**', '*.py'), recursive=True))

# (embed_dims, depths, window, drop_path_rate, out_indices) each recipe publishes.
T, S, B = (96, [2, 2, 6, 2]), (96, [2, 2, 18, 2]), (128, [2, 2, 18, 2])
RECIPES = {
    'swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py': (*T, 7, 0.2, 12),
    'swin_rpe/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py': (*T, 7, 0.2, 36),
    'swin_rpe/mask-rcnn_swin-s-p4-w7_fpn_ms-crop-3x_coco.py': (*S, 7, 0.2, 36),
    'swin_rpe/cascade-mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py': (*T, 7, 0.2, 36),
    'swin_rpe/cascade-mask-rcnn_swin-s-p4-w7_fpn_ms-crop-3x_coco.py': (*S, 7, 0.2, 36),
    'swin_rpe/retinanet_swin-t-p4-w7_fpn_1x_coco.py': (*T, 7, 0.2, 12),
    'swin_rpe/upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py': (*T, 7, 0.3, 160000),
    'swin_rpe/upernet_swin-s-p4-w7_8xb2-160k_ade20k-512x512.py': (*S, 7, 0.3, 160000),
    'swin_rpe/upernet_swin-b-p4-w7_8xb2-160k_ade20k-512x512.py': (*B, 7, 0.3, 160000),
    'swin_rpe/upernet_swin-b-p4-w12_8xb2-160k_ade20k-512x512.py': (*B, 12, 0.3, 160000),
    # SwinV2-T, window 16 from window-8 weights
    'swin_rpe/mask-rcnn_swinv2-t-p4-w16-pre-w8_fpn_1x_coco.py': (*T, 16, 0.2, 12),
    'swin_rpe/mask-rcnn_swinv2-t-p4-w16-pre-w8_fpn_ms-crop-3x_coco.py': (*T, 16, 0.2, 36),
    'swin_rpe/upernet_swinv2-t-p4-w16-pre-w8_8xb2-160k_ade20k-512x512.py': (*T, 16, 0.3, 160000),
}


def rel(path):
    return os.path.relpath(path, os.path.join(ROOT, 'configs'))


def build(cfg):
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    registry = importlib.import_module(f'{cfg.default_scope}.registry').MODELS
    cfg.model.backbone.init_cfg = None  # no weights here; the path is checked below
    return registry.build(cfg.model)


def test_every_recipe_has_a_config():
    assert set(RECIPES) <= {rel(p) for p in CONFIGS}


@pytest.mark.parametrize('path', CONFIGS, ids=rel)
def test_config_builds_and_decays_the_named_parameters(path):
    from mmengine.optim import build_optim_wrapper
    from swin_rpe_plugin import SwinTransformer, SwinTransformerV2
    cfg = Config.fromfile(path)
    backbone_cfg = cfg.model.backbone
    v2 = 'swinv2' in rel(path)
    assert backbone_cfg.type == ('swin_rpe_plugin.SwinTransformerV2' if v2 else
                                 'swin_rpe_plugin.SwinTransformer')
    if rel(path) in RECIPES:
        dims, depths, window, dpr, length = RECIPES[rel(path)]
        assert (backbone_cfg.embed_dims, list(backbone_cfg.depths), backbone_cfg.window_size,
                backbone_cfg.drop_path_rate) == (dims, depths, window, dpr)
        loop = cfg.train_cfg
        assert loop.get('max_epochs', loop.get('max_iters')) == length
        # The user points init_cfg at local weights; nothing is fetched from the network.
        checkpoint = backbone_cfg.init_cfg.checkpoint
        assert checkpoint.startswith('checkpoints/') and '://' not in checkpoint
        assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    model = build(cfg)
    assert type(model.backbone) is (SwinTransformerV2 if v2 else SwinTransformer)

    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay_of = {}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            decay_of[id(p)] = group['weight_decay']
    names = dict(model.named_parameters())
    zero = {n for n, p in names.items() if decay_of[id(p)] == 0}
    # What the recipe names, found from module types (not from the custom-key substrings):
    # the backbone's LayerNorms, its relative position bias tables and absolute embedding
    # (SwinV2, as the official code: the position-bias MLP and the logit scales instead of
    # the tables).
    expected = {f'backbone.{m}.{p}' for m, mod in model.backbone.named_modules()
                if isinstance(mod, torch.nn.LayerNorm) for p, _ in mod.named_parameters()}
    if v2:
        expected |= {f'backbone.{m}.{p}' for m, mod in model.backbone.named_modules()
                     if m.endswith('cpb_mlp') for p, _ in mod.named_parameters()}
        expected |= {n for n in names if n.endswith(('logit_scale', 'absolute_pos_embed'))}
        assert any(n.endswith('cpb_mlp.2.weight') for n in expected)
    else:
        expected |= {n for n in names if n.endswith(('relative_position_bias_table',
                                                     'absolute_pos_embed'))}
        assert any(n.endswith('relative_position_bias_table') for n in expected)
    assert zero == expected
    base = cfg.optim_wrapper.optimizer.weight_decay
    assert base > 0 and all(decay_of[id(p)] == base for n, p in names.items() if n not in zero)
