"""Analysis behind tools/: complexity counts (mmengine's counters) and RPE pictures."""
from .complexity import (CONVENTION, attention_table, backbone_breakdown, count_complexity,
                         flop_analyzer, msa_flops, sdpa_flop_jit, stage_attention_formula,
                         wmsa_flops)
from .models import (ARCHS, ARCHS_V2, SwinClassifier, build_classifier, build_from_config,
                     config_inputs)

__all__ = ['ARCHS', 'ARCHS_V2', 'CONVENTION', 'SwinClassifier', 'attention_table',
           'backbone_breakdown', 'build_classifier', 'build_from_config', 'config_inputs',
           'count_complexity', 'flop_analyzer', 'msa_flops', 'sdpa_flop_jit',
           'stage_attention_formula', 'wmsa_flops']
