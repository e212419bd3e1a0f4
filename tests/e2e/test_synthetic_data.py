"""The synthetic sets round-trip through mmdet's/mmseg's own dataset classes and metrics."""
import filecmp
import json
import os

import cv2
import numpy as np
import pytest
import torch

from swin_rpe_plugin.datasets import SEG_CLASSES, SHAPES, make_synthetic_data


@pytest.fixture(scope='module')
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp('synthetic')
    return make_synthetic_data(str(root), num_train=6, num_val=5, seed=3, progress=False)


def test_same_seed_same_files_other_seed_other_files(tmp_path, synthetic):
    again = make_synthetic_data(str(tmp_path / 'a'), 6, 5, seed=3, progress=False)
    other = make_synthetic_data(str(tmp_path / 'b'), 6, 5, seed=4, progress=False)
    for rel in ('annotations/instances_val.json', 'val/000002.jpg'):
        assert filecmp.cmp(os.path.join(synthetic['coco'], rel),
                           os.path.join(again['coco'], rel), shallow=False)
        assert not filecmp.cmp(os.path.join(synthetic['coco'], rel),
                               os.path.join(other['coco'], rel), shallow=False)
    rel = 'annotations/validation/000001.png'
    assert filecmp.cmp(os.path.join(synthetic['ade'], rel), os.path.join(again['ade'], rel),
                       shallow=False)


def test_coco_annotations_are_consistent(synthetic):
    from pycocotools.coco import COCO
    coco = COCO(os.path.join(synthetic['coco'], 'annotations/instances_val.json'))
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(SHAPES)
    assert len(coco.getImgIds()) == 5 and len(coco.getAnnIds()) >= 5
    for ann in coco.loadAnns(coco.getAnnIds()):
        mask = coco.annToMask(ann)
        ys, xs = np.nonzero(mask)
        x, y, w, h = ann['bbox']
        # The box is the polygon's extent; the rasterised mask lies within it (1 px slack).
        assert xs.min() >= x - 1 and xs.max() <= x + w + 1
        assert ys.min() >= y - 1 and ys.max() <= y + h + 1
        assert abs(mask.sum() - ann['area']) <= 0.02 * ann['area'] + 2
        assert ann['iscrowd'] == 0


def perfect_detections(coco, img_id):
    anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
    cat_ids = coco.getCatIds()
    boxes = [[a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
              a['bbox'][1] + a['bbox'][3]] for a in anns]
    return dict(
        bboxes=torch.tensor(boxes, dtype=torch.float32),
        scores=torch.ones(len(anns)),
        labels=torch.tensor([cat_ids.index(a['category_id']) for a in anns]),
        masks=torch.from_numpy(np.stack([coco.annToMask(a) for a in anns]).astype(bool)))


def test_coco_set_through_mmdet_dataset_and_metric(synthetic):
    import swin_rpe_plugin.datasets.coco_shapes  # noqa: F401  (registers the dataset)
    from mmdet.evaluation import CocoMetric
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope
    from pycocotools.coco import COCO
    init_default_scope('mmdet')
    ann_file = os.path.join(synthetic['coco'], 'annotations/instances_val.json')
    dataset = DATASETS.build(dict(
        type='ShapesCocoDataset', data_root=synthetic['coco'],
        ann_file='annotations/instances_val.json', data_prefix=dict(img='val/'),
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
                  dict(type='PackDetInputs')]))
    coco = COCO(ann_file)
    assert len(dataset) == 5 and dataset.metainfo['classes'] == SHAPES
    sample = dataset[0]['data_samples']
    expected = perfect_detections(coco, sample.img_id)
    assert torch.allclose(sample.gt_instances.bboxes.tensor, expected['bboxes'])
    assert sample.gt_instances.labels.tolist() == expected['labels'].tolist()

    metric = CocoMetric(ann_file=ann_file, metric=['bbox', 'segm'])
    metric.dataset_meta = dataset.metainfo
    for img_id in coco.getImgIds():
        info = coco.loadImgs(img_id)[0]
        metric.process({}, [dict(img_id=img_id, ori_shape=(info['height'], info['width']),
                                 pred_instances=perfect_detections(coco, img_id))])
    results = metric.evaluate(size=len(coco.getImgIds()))
    assert results['coco/bbox_mAP'] == pytest.approx(1.0)
    assert results['coco/segm_mAP'] == pytest.approx(1.0)


def test_ade_set_through_mmseg_dataset_and_metric(synthetic):
    import swin_rpe_plugin.datasets.ade_shapes  # noqa: F401  (registers the dataset)
    from mmengine.registry import init_default_scope
    from mmseg.evaluation import IoUMetric
    from mmseg.registry import DATASETS
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData
    init_default_scope('mmseg')
    dataset = DATASETS.build(dict(
        type='ShapesADE20KDataset', data_root=synthetic['ade'],
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations', reduce_zero_label=True),
                  dict(type='PackSegInputs')]))
    assert len(dataset) == 5 and dataset.metainfo['classes'] == SEG_CLASSES

    perfect, background = IoUMetric(), IoUMetric()
    for metric in (perfect, background):
        metric.dataset_meta = dataset.metainfo
    bg_hits = valid = 0
    present = set()
    for i in range(len(dataset)):
        item = dataset[i]['data_samples']
        raw = cv2.imread(item.seg_map_path, cv2.IMREAD_UNCHANGED).astype(np.int64)
        # ADE20K's reduce_zero_label: 0 -> 255 (ignored), k -> k - 1.
        reduced = np.where(raw == 0, 255, raw - 1)
        gt = item.gt_sem_seg.data[0].numpy()
        np.testing.assert_array_equal(gt, reduced)
        assert set(np.unique(reduced)) <= {0, 1, 2, 3, 4, 255} and (reduced == 255).any()
        for metric, pred in ((perfect, gt), (background, np.zeros_like(gt))):
            out = SegDataSample(gt_sem_seg=item.gt_sem_seg,
                                pred_sem_seg=PixelData(data=torch.from_numpy(pred)[None]))
            metric.process({}, [out.to_dict()])
        bg_hits += int((gt == 0).sum())
        valid += int((gt != 255).sum())
        present |= set(np.unique(gt[(gt != 255) & (gt != 0)]).tolist())
    assert perfect.evaluate(len(dataset))['mIoU'] == pytest.approx(100.0)
    # All-background prediction: IoU(background) = bg / valid pixels, 0 for each shape class in
    # the set (a class absent from both is NaN and left out); percent, rounded to 2 decimals.
    assert background.evaluate(len(dataset))['mIoU'] == pytest.approx(
        100 * bg_hits / valid / (1 + len(present)), abs=0.01)


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match='num_train'):
        make_synthetic_data(str(tmp_path), num_train=0, num_val=1, progress=False)
