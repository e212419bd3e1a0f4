# UperNet, Swin-B backbone (ours, window 7, 224 pretraining), ADE20K 512x512, 160k iterations.
# The recipe of mmseg's configs/swin/swin-base-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py.
_base_ = ['./upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py']

# ImageNet-1k Swin-B (224) weights (any format the loader reads; see README). None: from scratch.
pretrained = 'checkpoints/swin_base_patch4_window7_224.pth'
model = dict(
    backbone=dict(
        embed_dims=128,
        depths=[2, 2, 18, 2],
        num_heads=[4, 8, 16, 32],
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None),
    decode_head=dict(in_channels=[128, 256, 512, 1024], num_classes=150),
    auxiliary_head=dict(in_channels=512, num_classes=150))
