# UperNet, Swin-B backbone (ours, window 12, 384 pretraining), ADE20K 512x512, 160k iterations.
# The recipe of mmseg's
# configs/swin/swin-base-patch4-window12-in1k-384x384-pre_upernet_8xb2-160k_ade20k-512x512.py.
_base_ = ['./upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py']

# ImageNet-1k Swin-B (384, window 12) weights (any format the loader reads; see README).
pretrained = 'checkpoints/swin_base_patch4_window12_384.pth'
model = dict(
    backbone=dict(
        pretrain_img_size=384,
        embed_dims=128,
        depths=[2, 2, 18, 2],
        num_heads=[4, 8, 16, 32],
        window_size=12,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None),
    decode_head=dict(in_channels=[128, 256, 512, 1024], num_classes=150),
    auxiliary_head=dict(in_channels=512, num_classes=150))
