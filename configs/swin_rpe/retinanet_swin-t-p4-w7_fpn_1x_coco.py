# RetinaNet, Swin-T backbone (ours), FPN from stage 1, 1x schedule, COCO. The model of mmdet's
# configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py with the AdamW recipe of the official Swin
# detection code (lr 1e-4, weight decay 0.05, none on position biases and norms).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['swin_rpe_plugin'], allow_failed_imports=False)
# Checkpoints carry the RNG states: resume is exact with drop path and dropout on.
custom_hooks = [dict(type='swin_rpe_plugin.RNGStateHook')]

# ImageNet-1k Swin-T weights (any format the loader reads; see README). None: from scratch.
pretrained = 'checkpoints/swin_tiny_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='swin_rpe_plugin.SwinTransformer',
        embed_dims=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        mlp_ratio=4,
        qkv_bias=True,
        qk_scale=None,
        drop_rate=0.,
        attn_drop_rate=0.,
        drop_path_rate=0.2,
        patch_norm=True,
        # Only the stages FPN reads: an unused output norm would get no gradient under DDP.
        out_indices=(1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None),
    neck=dict(in_channels=[192, 384, 768], start_level=0, num_outs=5))

optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }),
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999),
                   weight_decay=0.05))
