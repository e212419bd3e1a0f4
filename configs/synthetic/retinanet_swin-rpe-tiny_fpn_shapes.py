# RetinaNet (single stage) with the tiny Swin of mask-rcnn_swin-rpe-tiny_fpn_shapes.py (ours:
# embed 32, depths 2-2-2-2, window 4) on the same synthetic COCO-format shapes
# (tools/make_synthetic_data.py), boxes only. The structure is mmdet's RetinaNet recipe with FPN
# from stage 1, as configs/swin_rpe/retinanet_swin-t-p4-w7_fpn_1x_coco.py; channels, anchors and
# the schedule shrink. Its whole model exports to ONNX / OpenVINO at any size (--part model:
# every level's class scores and box deltas; see docs/deployment.md).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
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
        # Only the stages FPN reads: an unused output norm would get no gradient under DDP.
        out_indices=(1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=[64, 128, 256], out_channels=64, start_level=0, num_outs=5),
    # Objects are 20-56 px: anchors of 16-406 px (base scale 2 at strides 8-128, 3 scales per
    # octave) cover them; the recipe's base scale 4 starts at 32 px.
    bbox_head=dict(num_classes=num_classes, in_channels=64, feat_channels=64, stacked_convs=2,
                   anchor_generator=dict(octave_base_scale=2)),
    test_cfg=dict(nms_pre=300, max_per_img=100))

dataset_type = 'ShapesCocoDataset'
data_root = 'data/synthetic/coco/'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
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
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', metric='bbox')
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
