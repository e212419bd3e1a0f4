# Mask R-CNN with a tiny Swin (ours: embed 32, depths 2-2-2-2, window 4) on the synthetic COCO-format
# shapes (tools/make_synthetic_data.py), sized to train from scratch on 2 CPU cores in minutes.
# The structure is mmdet's Mask R-CNN recipe; channels, proposal counts and the schedule shrink.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['swin_rpe_plugin', 'swin_rpe_plugin.datasets.coco_shapes'],
                      allow_failed_imports=False)
# Checkpoints carry the RNG states: resume is exact with drop path and dropout on.
custom_hooks = [dict(type='swin_rpe_plugin.RNGStateHook')]

num_classes = 4
image_size = (128, 128)
model = dict(
    backbone=dict(
        _delete_=True,
        type='swin_rpe_plugin.SwinTransformer',
        pretrain_img_size=image_size,
        embed_dims=32,
        depths=[2, 2, 2, 2],
        num_heads=[1, 2, 4, 8],
        window_size=4,
        mlp_ratio=4,
        qkv_bias=True,
        drop_path_rate=0.05,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=64),
    # Objects are 20-56 px: anchors of 16-256 px (scale 4 at strides 4-64) cover them.
    rpn_head=dict(in_channels=64, feat_channels=64, anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, fc_out_channels=256, num_classes=num_classes),
        mask_roi_extractor=dict(out_channels=64),
        mask_head=dict(num_convs=2, in_channels=64, conv_out_channels=64,
                       num_classes=num_classes)),
    train_cfg=dict(rpn_proposal=dict(nms_pre=500, max_per_img=200),
                   rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=100)))

dataset_type = 'ShapesCocoDataset'
data_root = 'data/synthetic/coco/'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root,
                 ann_file='annotations/instances_train.json', data_prefix=dict(img='train/'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(type=dataset_type, data_root=data_root,
                 ann_file='annotations/instances_val.json', data_prefix=dict(img='val/'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json',
                     metric=['bbox', 'segm'])
test_evaluator = val_evaluator

max_iters = 800
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=50, end=max_iters, eta_min_ratio=0.05),
]
# The Swin recipe's AdamW, with no weight decay on position biases and norms; a larger lr,
# since this runs from random init for a few hundred iterations.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=10.0),
    paramwise_cfg=dict(custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }))
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
