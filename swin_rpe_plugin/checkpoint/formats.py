"""How each library names Swin V1 and V2 weights: one table of key rules per source format (data
only).

A format is recognised from its keys (``require``: each pattern matches some key; ``forbid``: no
key matches), after the container is unwrapped (``state_dict`` / ``model`` / ``module``), the
prefix of a whole model is split off (``MODEL_PREFIXES``) and a format's ``optional_prefix``
(transformers' ``swin.``) is stripped from the keys that carry it. Each rule maps a source key to our
name (mmdet 3.3 names: ``stages.i.blocks.j.attn.w_msa.qkv.weight``). In a target:
- ``{g}`` is the regex group ``g``; ``{g|fn}`` applies ``INDEX_MAPS[fn]`` to it (stage numbering);
- a trailing ``[q]``, ``[k]`` or ``[v]`` marks one third of a fused qkv tensor (rows q, k, v);
- a trailing ``<a|b|c>`` splits the source into thirds (rows) named ``a``, ``b``, ``c`` in place of
  the ``<...>``; ``-`` drops that third (torchvision's fused V2 qkv bias, whose k third is unused);
- ``None`` means the key is not a backbone weight: ignored and counted in the report.
The first matching rule wins. A key no rule matches is reported as unexpected.

``merge_order``: how the 2x2 neighbourhood is concatenated before a patch-merging reduction.
'unfold' is ours and mmcv's ``nn.Unfold`` order (c, ky, kx); 'official' is Microsoft's
``cat([x0, x1, x2, x3])`` with x0=(0,0), x1=(1,0), x2=(0,1), x3=(1,1) (timm, torchvision and
transformers use it too); its tensors are reordered on load (as mmdet's ``swin_converter``).
In V2 the merging norm follows the reduction (2C channels), so only the reduction is reordered.

``arch``: 'v1' (bias tables) or 'v2' (continuous position bias); the loader refuses to put one
into the other. V2 formats are listed first: V1 signatures also match V2 keys.

Sources: Microsoft Swin-Transformer ``models/swin_transformer.py`` and
Swin-Transformer-Object-Detection; mmdet 3.3 / mmseg 1.2 / mmpretrain 1.2 ``SwinTransformer``;
timm ``swin_transformer.py`` (< 0.9: merging at the end of a stage; >= 0.9: at the start of the
next); torchvision 0.13+ ``swin_t``; transformers ``SwinModel`` (4.x and 5.x, on disk and in
memory). Listings of full Swin-T keys are in ``tests/fixtures/swin/*_keys.json``.
SwinV2: Microsoft ``models/swin_transformer_v2.py``; mmpretrain 1.x ``SwinTransformerV2``; timm
``swin_transformer_v2.py`` (>= 0.9); torchvision ``swin_v2_t/s/b``; transformers ``Swinv2Model``.
"""
import dataclasses
from typing import Callable, Dict, Optional, Tuple

Rule = Tuple[str, Optional[str]]

INDEX_MAPS: Dict[str, Callable[[int], int]] = {
    'prev': lambda n: n - 1,               # timm >= 0.9: layers.i.downsample ends stage i - 1
    'tv_stage': lambda n: (n - 1) // 2,    # torchvision: features.2i+1 are stage i's blocks
    'tv_merge': lambda n: n // 2 - 1,      # torchvision: features.2i+2 merges after stage i
}

# Whole-model prefixes: keys under the prefix are the backbone, every other key is ignored.
MODEL_PREFIXES: Dict[str, str] = {
    'backbone.': 'whole mmdet detector / mmseg segmentor / mmpretrain classifier',
}

# Keys derived from the window size: never read from a checkpoint.
DERIVED = (r'(^|\.)relative_position_index$', r'(^|\.)attn_mask$', r'(^|\.)relative_coords_table$')


@dataclasses.dataclass(frozen=True)
class Format:
    name: str
    description: str
    require: Tuple[str, ...]
    rules: Tuple[Rule, ...]
    forbid: Tuple[str, ...] = ()
    merge_order: str = 'unfold'
    optional_prefix: str = ''  # stripped from any key that has it, before detection and rules
    arch: str = 'v1'


# Shared by the three formats that use the official block names.
_OFFICIAL_BLOCK: Tuple[Rule, ...] = (
    (r'^patch_embed\.proj\.(?P<p>\w+)$', 'patch_embed.projection.{p}'),
    (r'^patch_embed\.norm\.(?P<p>\w+)$', 'patch_embed.norm.{p}'),
    (r'^absolute_pos_embed$', 'absolute_pos_embed'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.norm(?P<n>[12])\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.norm{n}.{p}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attn\.(?P<m>qkv|proj)\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.attn.w_msa.{m}.{p}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attn\.relative_position_bias_table$',
     'stages.{s}.blocks.{b}.attn.w_msa.relative_position_bias_table'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.mlp\.fc1\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.ffn.layers.0.0.{p}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.mlp\.fc2\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.ffn.layers.1.{p}'),
    (r'^norm(?P<i>\d)\.(?P<p>\w+)$', 'norm{i}.{p}'),  # official detection backbone
    (r'^norm\.\w+$', None),                          # classifier's final norm
    (r'^head(\.fc)?\.\w+$', None),
)

# SwinV2 block keys of the official code, timm and (with 'layers' -> 'features') torchvision.
_OFFICIAL_V2_BLOCK: Tuple[Rule, ...] = (
    (r'^patch_embed\.proj\.(?P<p>\w+)$', 'patch_embed.projection.{p}'),
    (r'^patch_embed\.norm\.(?P<p>\w+)$', 'patch_embed.norm.{p}'),
    (r'^absolute_pos_embed$', 'absolute_pos_embed'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.norm(?P<n>[12])\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.norm{n}.{p}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attn\.(?P<m>qkv|proj)\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.attn.w_msa.{m}.{p}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attn\.(?P<m>q_bias|v_bias|logit_scale)$',
     'stages.{s}.blocks.{b}.attn.w_msa.{m}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attn\.k_bias$', None),  # zeros (timm buffer)
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attn\.cpb_mlp\.(?P<n>[02])\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.attn.w_msa.cpb_mlp.{n}.{p}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.mlp\.fc1\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.ffn.layers.0.0.{p}'),
    (r'^layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.mlp\.fc2\.(?P<p>\w+)$',
     'stages.{s}.blocks.{b}.ffn.layers.1.{p}'),
    (r'^norm\.\w+$', None),                          # classifier's final norm
    (r'^head(\.fc)?\.\w+$', None),
)
_CPB = r'\.attn\.w_msa\.cpb_mlp\.0\.weight$'
_TV = r'^features\.(?P<k>\d*[13579])\.(?P<b>\d+)\.'  # torchvision: stage k // 2's blocks
_HF = r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.'
_HF_ATTN = _HF + r'attention\.self\.'

FORMATS_V2: Tuple[Format, ...] = (
    Format(
        name='swinv2',
        description='swin_rpe_plugin SwinTransformerV2 (our names; mmdet/mmseg models under '
                    "'backbone.'): patch merging at the end of each stage",
        require=(r'^stages\.\d+\.blocks\.\d+' + _CPB, r'^stages\.0\.downsample\.'),
        rules=(
            (r'^(?P<k>(patch_embed|stages|norm\d)\..+|absolute_pos_embed)$', '{k}'),
            (r'^(head|neck)\..+$', None),
        ),
        arch='v2'),
    Format(
        name='mmpretrain_v2',
        description='mmpretrain 1.x SwinTransformerV2: our block names, patch merging (unfold '
                    'order) at the start of stages 1..3',
        require=(r'^stages\.\d+\.blocks\.\d+' + _CPB,),
        forbid=(r'^stages\.0\.downsample\.',),
        rules=(
            (r'^stages\.(?P<s>\d+)\.downsample\.(?P<r>.+)$', 'stages.{s|prev}.downsample.{r}'),
            (r'^(?P<k>(patch_embed|stages|norm\d)\..+|absolute_pos_embed)$', '{k}'),
            (r'^(head|neck)\..+$', None),
        ),
        arch='v2'),
    Format(
        name='official_v2',
        description='Microsoft official SwinV2 / timm < 0.9 swinv2: patch merging at the end '
                    'of each stage',
        require=(r'^layers\.\d+\.blocks\.\d+\.attn\.cpb_mlp\.0\.weight$',
                 r'^layers\.0\.downsample\.'),
        rules=_OFFICIAL_V2_BLOCK + (
            (r'^layers\.(?P<s>\d+)\.downsample\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{s}.downsample.{m}.{p}'),
        ),
        merge_order='official', arch='v2'),
    Format(
        name='timm_v2',
        description='timm >= 0.9 SwinTransformerV2: patch merging at the start of stages 1..3',
        require=(r'^layers\.\d+\.blocks\.\d+\.attn\.cpb_mlp\.0\.weight$',),
        forbid=(r'^layers\.0\.downsample\.',),
        rules=_OFFICIAL_V2_BLOCK + (
            (r'^layers\.(?P<s>\d+)\.downsample\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{s|prev}.downsample.{m}.{p}'),
        ),
        merge_order='official', arch='v2'),
    Format(
        name='torchvision_v2',
        description='torchvision swin_v2_t/s/b: features.0 embed, features.2i+1 stage i, '
                    'features.2i+2 merging; one fused qkv bias (its k third unused)',
        require=(r'^features\.\d+\.\d+\.attn\.cpb_mlp\.0\.weight$',),
        rules=(
            (r'^features\.0\.0\.(?P<p>\w+)$', 'patch_embed.projection.{p}'),
            (r'^features\.0\.2\.(?P<p>\w+)$', 'patch_embed.norm.{p}'),
            (_TV + r'norm(?P<n>[12])\.(?P<p>\w+)$', 'stages.{k|tv_stage}.blocks.{b}.norm{n}.{p}'),
            (_TV + r'attn\.qkv\.weight$', 'stages.{k|tv_stage}.blocks.{b}.attn.w_msa.qkv.weight'),
            (_TV + r'attn\.qkv\.bias$', 'stages.{k|tv_stage}.blocks.{b}.attn.w_msa.'
                                          '<q_bias|-|v_bias>'),
            (_TV + r'attn\.(?P<m>proj\.\w+|logit_scale|cpb_mlp\.[02]\.\w+)$',
             'stages.{k|tv_stage}.blocks.{b}.attn.w_msa.{m}'),
            (_TV + r'mlp\.0\.(?P<p>\w+)$', 'stages.{k|tv_stage}.blocks.{b}.ffn.layers.0.0.{p}'),
            (_TV + r'mlp\.3\.(?P<p>\w+)$', 'stages.{k|tv_stage}.blocks.{b}.ffn.layers.1.{p}'),
            (r'^features\.(?P<k>\d*[02468])\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{k|tv_merge}.downsample.{m}.{p}'),
            (r'^(norm|head)\.\w+$', None),
        ),
        merge_order='official', arch='v2'),
    Format(
        name='transformers_v2',
        description='transformers Swinv2Model / Swinv2Backbone / Swinv2ForImageClassification: '
                    'separate q, k, v (no k bias)',
        require=(_HF_ATTN + r'continuous_position_bias_mlp\.',),
        rules=(
            (r'^embeddings\.patch_embeddings\.projection\.(?P<p>\w+)$',
             'patch_embed.projection.{p}'),
            (r'^embeddings\.norm\.(?P<p>\w+)$', 'patch_embed.norm.{p}'),
            (r'^embeddings\.mask_token$', None),  # masked-image-modeling token
            (_HF + r'layernorm_before\.(?P<p>\w+)$', 'stages.{s}.blocks.{b}.norm1.{p}'),
            (_HF + r'layernorm_after\.(?P<p>\w+)$', 'stages.{s}.blocks.{b}.norm2.{p}'),
            (_HF_ATTN + r'query\.weight$', 'stages.{s}.blocks.{b}.attn.w_msa.qkv.weight[q]'),
            (_HF_ATTN + r'key\.weight$', 'stages.{s}.blocks.{b}.attn.w_msa.qkv.weight[k]'),
            (_HF_ATTN + r'value\.weight$', 'stages.{s}.blocks.{b}.attn.w_msa.qkv.weight[v]'),
            (_HF_ATTN + r'query\.bias$', 'stages.{s}.blocks.{b}.attn.w_msa.q_bias'),
            (_HF_ATTN + r'value\.bias$', 'stages.{s}.blocks.{b}.attn.w_msa.v_bias'),
            (_HF_ATTN + r'logit_scale$', 'stages.{s}.blocks.{b}.attn.w_msa.logit_scale'),
            (_HF_ATTN + r'continuous_position_bias_mlp\.(?P<n>[02])\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.attn.w_msa.cpb_mlp.{n}.{p}'),
            (_HF + r'attention\.output\.dense\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.attn.w_msa.proj.{p}'),
            (_HF + r'intermediate\.dense\.(?P<p>\w+)$', 'stages.{s}.blocks.{b}.ffn.layers.0.0.{p}'),
            (_HF + r'output\.dense\.(?P<p>\w+)$', 'stages.{s}.blocks.{b}.ffn.layers.1.{p}'),
            (r'^encoder\.layers\.(?P<s>\d+)\.downsample\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{s}.downsample.{m}.{p}'),
            (r'^(layernorm|classifier|pooler)\.\w+$', None),
        ),
        merge_order='official', optional_prefix='swinv2.', arch='v2'),
)

FORMATS: Tuple[Format, ...] = FORMATS_V2 + (
    Format(
        name='mmdet',
        description='mmdet 3.x / mmseg 1.x / mmpretrain 1.x SwinTransformer (our names)',
        require=(r'^stages\.\d+\.blocks\.\d+\.attn\.w_msa\.qkv\.weight$',),
        rules=(
            (r'^(?P<k>(patch_embed|stages|norm\d)\..+|absolute_pos_embed)$', '{k}'),
            (r'^(head|neck)\..+$', None),  # mmpretrain classifier parts
        )),
    Format(
        name='official',
        description='Microsoft official Swin (classification or detection) / timm < 0.9: '
                    'patch merging at the end of each stage',
        require=(r'^layers\.\d+\.blocks\.\d+\.attn\.qkv\.weight$', r'^layers\.0\.downsample\.'),
        rules=_OFFICIAL_BLOCK + (
            (r'^layers\.(?P<s>\d+)\.downsample\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{s}.downsample.{m}.{p}'),
        ),
        merge_order='official'),
    Format(
        name='timm',
        description='timm >= 0.9 SwinTransformer: patch merging at the start of stages 1..3',
        require=(r'^layers\.\d+\.blocks\.\d+\.attn\.qkv\.weight$',),
        forbid=(r'^layers\.0\.downsample\.',),
        rules=_OFFICIAL_BLOCK + (
            (r'^layers\.(?P<s>\d+)\.downsample\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{s|prev}.downsample.{m}.{p}'),
        ),
        merge_order='official'),
    Format(
        name='torchvision',
        description='torchvision swin_t/s/b (v1): features.0 embed, features.2i+1 stage i, '
                    'features.2i+2 merging',
        require=(r'^features\.\d+\.\d+\.attn\.qkv\.weight$',),
        rules=(
            (r'^features\.0\.0\.(?P<p>\w+)$', 'patch_embed.projection.{p}'),
            (r'^features\.0\.2\.(?P<p>\w+)$', 'patch_embed.norm.{p}'),
            (r'^features\.(?P<k>\d*[13579])\.(?P<b>\d+)\.norm(?P<n>[12])\.(?P<p>\w+)$',
             'stages.{k|tv_stage}.blocks.{b}.norm{n}.{p}'),
            (r'^features\.(?P<k>\d*[13579])\.(?P<b>\d+)\.attn\.(?P<m>qkv|proj)\.(?P<p>\w+)$',
             'stages.{k|tv_stage}.blocks.{b}.attn.w_msa.{m}.{p}'),
            (r'^features\.(?P<k>\d*[13579])\.(?P<b>\d+)\.attn\.relative_position_bias_table$',
             'stages.{k|tv_stage}.blocks.{b}.attn.w_msa.relative_position_bias_table'),
            (r'^features\.(?P<k>\d*[13579])\.(?P<b>\d+)\.mlp\.0\.(?P<p>\w+)$',
             'stages.{k|tv_stage}.blocks.{b}.ffn.layers.0.0.{p}'),
            (r'^features\.(?P<k>\d*[13579])\.(?P<b>\d+)\.mlp\.3\.(?P<p>\w+)$',
             'stages.{k|tv_stage}.blocks.{b}.ffn.layers.1.{p}'),
            (r'^features\.(?P<k>\d*[02468])\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{k|tv_merge}.downsample.{m}.{p}'),
            (r'^(norm|head)\.\w+$', None),
        ),
        merge_order='official'),
    Format(
        name='transformers',
        description='transformers SwinModel / SwinBackbone / SwinForImageClassification '
                    '(4.x and 5.x names): separate q, k, v',
        require=(r'^encoder\.layers\.\d+\.blocks\.\d+\.attention\.',),
        rules=(
            (r'^embeddings\.patch_embeddings\.projection\.(?P<p>\w+)$',
             'patch_embed.projection.{p}'),
            (r'^embeddings\.norm\.(?P<p>\w+)$', 'patch_embed.norm.{p}'),
            (r'^embeddings\.mask_token$', None),  # masked-image-modeling token
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.layernorm_before\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.norm1.{p}'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.layernorm_after\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.norm2.{p}'),
            # on disk (4.x, and 5.x save_pretrained) ...
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.self\.query\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.attn.w_msa.qkv.{p}[q]'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.self\.key\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.attn.w_msa.qkv.{p}[k]'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.self\.value\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.attn.w_msa.qkv.{p}[v]'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.self\.'
             r'relative_position_bias_table$',
             'stages.{s}.blocks.{b}.attn.w_msa.relative_position_bias_table'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.output\.dense\.'
             r'(?P<p>\w+)$', 'stages.{s}.blocks.{b}.attn.w_msa.proj.{p}'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.intermediate\.dense\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.ffn.layers.0.0.{p}'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.output\.dense\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.ffn.layers.1.{p}'),
            # ... and in memory (5.x)
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.(?P<x>[qkv])_proj\.'
             r'(?P<p>\w+)$', 'stages.{s}.blocks.{b}.attn.w_msa.qkv.{p}[{x}]'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.o_proj\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.attn.w_msa.proj.{p}'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.attention\.relative_position_bias'
             r'\.relative_position_bias_table$',
             'stages.{s}.blocks.{b}.attn.w_msa.relative_position_bias_table'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.mlp\.fc1\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.ffn.layers.0.0.{p}'),
            (r'^encoder\.layers\.(?P<s>\d+)\.blocks\.(?P<b>\d+)\.mlp\.fc2\.(?P<p>\w+)$',
             'stages.{s}.blocks.{b}.ffn.layers.1.{p}'),
            (r'^encoder\.layers\.(?P<s>\d+)\.downsample\.(?P<m>reduction|norm)\.(?P<p>\w+)$',
             'stages.{s}.downsample.{m}.{p}'),
            (r'^hidden_states_norms\.stage(?P<k>\d+)\.(?P<p>\w+)$', 'norm{k|prev}.{p}'),
            (r'^(layernorm|classifier|pooler)\.\w+$', None),
        ),
        # SwinForImageClassification / SwinBackbone put the encoder (some or all of it) under
        # 'swin.' and their own parts (classifier, hidden_states_norms) outside it.
        merge_order='official', optional_prefix='swin.'),
)

FORMATS_BY_NAME: Dict[str, Format] = {f.name: f for f in FORMATS}
