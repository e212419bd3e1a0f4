# Mask R-CNN with a tiny SwinV2 (ours: embed 32, depths 2-2-2-2, window 4) on the synthetic
# COCO-format shapes: ./mask-rcnn_swin-rpe-tiny_fpn_shapes.py with the backbone swapped.
# `tools/demo.py --arch v2` runs it.
_base_ = ['./mask-rcnn_swin-rpe-tiny_fpn_shapes.py']

model = dict(
    backbone=dict(
        _delete_=True,
        type='swin_rpe_plugin.SwinTransformerV2',
        pretrain_img_size={{_base_.image_size}},
        embed_dims=32,
        depths=[2, 2, 2, 2],
        num_heads=[1, 2, 4, 8],
        window_size=4,
        pretrained_window_size=0,
        mlp_ratio=4,
        qkv_bias=True,
        drop_path_rate=0.05,
        out_indices=(0, 1, 2, 3),
        init_cfg=None))

# No weight decay on the position-bias MLP and the logit scales (as the official SwinV2 code).
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={
    'cpb_mlp': dict(decay_mult=0.),
    'logit_scale': dict(decay_mult=0.),
}))
