# Cascade Mask R-CNN, Swin-S backbone (ours), FPN, 3x multi-scale-crop, COCO. The recipe of the
# official Swin detection code (cascade_mask_rcnn_swin_small_..._giou_4conv1f_adamw_3x_coco.py).
_base_ = ['./cascade-mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py']

# ImageNet-1k Swin-S weights (any format the loader reads; see README). None: from scratch.
pretrained = 'checkpoints/swin_small_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        depths=[2, 2, 18, 2],
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None))
