# UperNet, SwinV2-T backbone (ours), ADE20K 512x512, 160k iterations: window 16 run from
# ImageNet-1k weights trained with window 8 (swinv2_tiny_patch4_window8_256). The recipe of
# ./upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py (mmseg:: bases) with the backbone swapped.
_base_ = ['./upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py']

# Any format the loader reads (see docs/swinv2.md). None: from scratch.
pretrained = 'checkpoints/swinv2_tiny_patch4_window8_256.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='swin_rpe_plugin.SwinTransformerV2',
        pretrain_img_size=256,
        embed_dims=96,
        patch_size=4,
        window_size=16,
        pretrained_window_size=8,
        mlp_ratio=4,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        strides=(4, 2, 2, 2),
        out_indices=(0, 1, 2, 3),
        qkv_bias=True,
        drop_rate=0.,
        attn_drop_rate=0.,
        drop_path_rate=0.3,
        use_abs_pos_embed=False,
        act_cfg=dict(type='GELU'),
        norm_cfg=dict(type='LN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained) if pretrained else None))

optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'absolute_pos_embed': dict(decay_mult=0.),
    'cpb_mlp': dict(decay_mult=0.),
    'logit_scale': dict(decay_mult=0.),
    'norm': dict(decay_mult=0.),
}))
