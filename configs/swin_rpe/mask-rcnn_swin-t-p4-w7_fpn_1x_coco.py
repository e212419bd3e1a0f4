# Mask R-CNN, Swin-T backbone (ours), FPN, 1x schedule, COCO. The recipe of mmdet's
# configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py with the backbone swapped.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['swin_rpe_plugin'], allow_failed_imports=False)
# Checkpoints carry the RNG states: resume is exact with drop path and dropout on.
custom_hooks = [dict(type='swin_rpe_plugin.RNGStateHook')]

# ImageNet-1k Swin-T weights (any format the loader reads; see README). Set to None to train
# from scratch. Nothing is downloaded when the model is built.
pretrained = 'checkpoints/swin_tiny_patch4_window7_224.pth'
model = dict(
    type='MaskRCNN',
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
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None),
    neck=dict(in_channels=[96, 192, 384, 768]))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }),
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999),
                   weight_decay=0.05))
