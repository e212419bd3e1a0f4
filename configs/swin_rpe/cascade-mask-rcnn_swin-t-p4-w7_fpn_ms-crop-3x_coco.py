# Cascade Mask R-CNN, Swin-T backbone (ours), FPN, 3x multi-scale-crop, COCO. The recipe of the
# official Swin detection code (cascade_mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_giou_
# 4conv1f_adamw_3x_coco.py) on mmdet 3.x bases: three 4conv1fc box heads with SyncBN and GIoU.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['swin_rpe_plugin'], allow_failed_imports=False)
# Checkpoints carry the RNG states: resume is exact with drop path and dropout on.
custom_hooks = [dict(type='swin_rpe_plugin.RNGStateHook')]

# ImageNet-1k Swin-T weights (any format the loader reads; see README). None: from scratch.
pretrained = 'checkpoints/swin_tiny_patch4_window7_224.pth'
head_norm_cfg = dict(type='SyncBN', requires_grad=True)  # BN without CUDA (tools/train.py)


def box_head(stds):
    return dict(
        type='ConvFCBBoxHead', num_shared_convs=4, num_shared_fcs=1, in_channels=256,
        conv_out_channels=256, fc_out_channels=1024, roi_feat_size=7, num_classes=80,
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                        target_stds=stds),
        reg_class_agnostic=False, reg_decoded_bbox=True, norm_cfg=head_norm_cfg,
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type='GIoULoss', loss_weight=10.0))


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
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None),
    neck=dict(in_channels=[96, 192, 384, 768]),
    roi_head=dict(bbox_head=[
        box_head([0.1, 0.1, 0.2, 0.2]),
        box_head([0.05, 0.05, 0.1, 0.1]),
        box_head([0.033, 0.033, 0.067, 0.067]),
    ]))
del box_head  # a config holds data only

# augmentation strategy originates from DETR / Sparse RCNN
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize',
                  scales=[(480, 1333), (512, 1333), (544, 1333), (576, 1333), (608, 1333),
                          (640, 1333), (672, 1333), (704, 1333), (736, 1333), (768, 1333),
                          (800, 1333)],
                  keep_ratio=True)],
            [dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)],
                  keep_ratio=True),
             dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                  allow_negative_crop=True),
             dict(type='RandomChoiceResize',
                  scales=[(480, 1333), (512, 1333), (544, 1333), (576, 1333), (608, 1333),
                          (640, 1333), (672, 1333), (704, 1333), (736, 1333), (768, 1333),
                          (800, 1333)],
                  keep_ratio=True)],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
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
