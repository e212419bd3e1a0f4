# Mask R-CNN, SwinV2-T backbone (ours, window 16 from window-8 weights), FPN, 3x schedule with
# multi-scale and crop augmentation, COCO: the recipe of
# ./mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py with the backbone and optimiser rules of
# ./mask-rcnn_swinv2-t-p4-w16-pre-w8_fpn_1x_coco.py.
_base_ = ['./mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py']

pretrained = 'checkpoints/swinv2_tiny_patch4_window8_256.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='swin_rpe_plugin.SwinTransformerV2',
        pretrain_img_size=256,
        embed_dims=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=16,
        pretrained_window_size=8,
        mlp_ratio=4,
        qkv_bias=True,
        drop_rate=0.,
        attn_drop_rate=0.,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None))

optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'absolute_pos_embed': dict(decay_mult=0.),
    'cpb_mlp': dict(decay_mult=0.),
    'logit_scale': dict(decay_mult=0.),
    'norm': dict(decay_mult=0.),
}))
