# Cascade Mask R-CNN with the tiny Swin of mask-rcnn_swin-rpe-tiny_fpn_shapes.py (ours: embed 32,
# depths 2-2-2-2, window 4) on the same synthetic COCO-format shapes
# (tools/make_synthetic_data.py). The structure is mmdet's Cascade Mask R-CNN recipe (three box
# stages at IoU 0.5 / 0.6 / 0.7, class-agnostic regression); channels and the schedule shrink
# as in the Mask R-CNN config this inherits.
_base_ = ['./mask-rcnn_swin-rpe-tiny_fpn_shapes.py']

num_classes = 4


def _stage(stds):
    return dict(
        type='Shared2FCBBoxHead', in_channels=64, fc_out_channels=256, roi_feat_size=7,
        num_classes=num_classes,
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                        target_stds=stds),
        reg_class_agnostic=True,
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type='SmoothL1Loss', beta=1.0, loss_weight=1.0))


def _train_stage(iou):
    return dict(
        assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou, neg_iou_thr=iou,
                      min_pos_iou=iou, match_low_quality=False, ignore_iof_thr=-1),
        sampler=dict(type='RandomSampler', num=64, pos_fraction=0.25, neg_pos_ub=-1,
                     add_gt_as_proposals=True),
        mask_size=28, pos_weight=-1, debug=False)


model = dict(
    type='CascadeRCNN',
    roi_head=dict(
        _delete_=True,
        type='CascadeRoIHead',
        num_stages=3,
        stage_loss_weights=[1, 0.5, 0.25],
        bbox_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0),
            out_channels=64, featmap_strides=[4, 8, 16, 32]),
        bbox_head=[_stage([0.1, 0.1, 0.2, 0.2]), _stage([0.05, 0.05, 0.1, 0.1]),
                   _stage([0.033, 0.033, 0.067, 0.067])],
        mask_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=0),
            out_channels=64, featmap_strides=[4, 8, 16, 32]),
        mask_head=dict(
            type='FCNMaskHead', num_convs=2, in_channels=64, conv_out_channels=64,
            num_classes=num_classes,
            loss_mask=dict(type='CrossEntropyLoss', use_mask=True, loss_weight=1.0))),
    train_cfg=dict(rcnn=[_train_stage(0.5), _train_stage(0.6), _train_stage(0.7)]))
