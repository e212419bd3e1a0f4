# UperNet, Swin-S backbone (ours), ADE20K 512x512, 160k iterations. The recipe of mmseg's
# configs/swin/swin-small-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py.
_base_ = ['./upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py']

# ImageNet-1k Swin-S weights (any format the loader reads; see README). None: from scratch.
pretrained = 'checkpoints/swin_small_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        depths=[2, 2, 18, 2],
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))
