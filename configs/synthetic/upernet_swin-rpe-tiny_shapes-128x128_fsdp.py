# The tiny UPerNet recipe trained sharded: mmengine's FlexibleRunner with mmengine's FSDPStrategy
# (torch's FullyShardedDataParallel; ours resumes on torch >= 2.1), one unit per Swin block,
# patch merging and patch embedding (swin_rpe_plugin.swin_block_wrap_policy; docs/training.md).
# Run it as any config:
#   tools/dist_train.sh configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128_fsdp.py 2
# Each rank saves its shards (state_dict_cfg='local': iter_N.pth/rank{r}.pth), which resume
# with the same number of processes.
_base_ = './upernet_swin-rpe-tiny_shapes-128x128.py'
runner_type = 'FlexibleRunner'
strategy = dict(
    type='swin_rpe_plugin.FSDPStrategy',
    model_wrapper=dict(auto_wrap_policy='swin_rpe_plugin.swin_block_wrap_policy',
                       use_orig_params=True),
    state_dict_cfg='local')
