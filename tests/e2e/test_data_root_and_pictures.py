"""--data-root and --show-dir of tools/test.py and tools/train.py, for mmdet and mmseg configs."""
import json
import os
import shutil
import subprocess
import sys

import cv2
import pytest

from swin_rpe_plugin.datasets import make_synthetic_data
from swin_rpe_plugin.engine import MissingPathError, load_config
from swin_rpe_plugin.engine.config import check_data_paths, set_data_root
from swin_rpe_plugin.engine.demo import save_initial_checkpoint, synthetic_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DET = os.path.join(ROOT, 'configs/synthetic/mask-rcnn_swin-rpe-tiny_fpn_shapes.py')
SEG = os.path.join(ROOT, 'configs/synthetic/upernet_swin-rpe-tiny_shapes-128x128.py')


def tool(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          env=env)


@pytest.fixture(scope='module')
def val_only(tmp_path_factory):
    """Synthetic sets with 3 validation images and the training folders removed."""
    root = str(tmp_path_factory.mktemp('data'))
    make_synthetic_data(root, num_train=2, num_val=3, seed=2, progress=False)
    shutil.rmtree(os.path.join(root, 'coco', 'train'))
    shutil.rmtree(os.path.join(root, 'ade', 'images', 'training'))
    shutil.rmtree(os.path.join(root, 'ade', 'annotations', 'training'))
    return root


def test_data_root_sets_every_path_of_a_stock_coco_config(tmp_path):
    from mmengine.config import Config
    cfg = Config.fromfile(_stock_coco())  # stock: data_root 'data/coco/'
    changed = set_data_root(cfg, '/d/coco')
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert cfg[loader].dataset.data_root == '/d/coco'
    # The evaluators read the annotation file directly: root + the dataset's ann_file.
    assert cfg.val_evaluator.ann_file == '/d/coco/annotations/instances_val2017.json'
    assert cfg.test_evaluator.ann_file == '/d/coco/annotations/instances_val2017.json'
    assert 'val_evaluator.ann_file' in changed and 'train_dataloader.dataset.data_root' in changed


def _stock_coco() -> str:
    import mmdet
    path = os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs', 'mask_rcnn',
                        'mask-rcnn_r50_fpn_1x_coco.py')
    assert os.path.isfile(path), path
    return path


def test_missing_data_names_the_option(tmp_path):
    gone = str(tmp_path / 'gone')  # not the config's default, which a demo run may create
    cfg = load_config(DET, {'train_dataloader.dataset.data_root': gone})
    with pytest.raises(MissingPathError, match=r"train_dataloader\.dataset\.data_root: directory "
                       rf"not found: '{gone}'; pass --data-root DIR"):
        check_data_paths(cfg, ('train_dataloader',))
    proc = tool('tools/test.py', SEG, __file__, '--data-root', str(tmp_path / 'none'))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --data-root: directory not found: '{tmp_path / 'none'}'")


def test_evaluator_annotation_file_is_checked(val_only):
    cfg = load_config(DET)
    set_data_root(cfg, synthetic_root('mmdet', val_only))
    cfg.test_evaluator.ann_file = os.path.join(val_only, 'missing.json')
    with pytest.raises(MissingPathError, match=r"test_evaluator\.ann_file: file not found: "
                       r"'.*missing\.json'; pass --data-root"):
        check_data_paths(cfg, ('test_dataloader',))


@pytest.mark.parametrize('config, toolkit, interval, expected', [
    (SEG, 'mmseg', 1, [0, 1, 2]),
    (SEG, 'mmseg', 2, [0, 2]),
    (DET, 'mmdet', 1, [0, 1, 2]),
])
def test_show_dir_draws_every_nth_image_without_training_data(val_only, tmp_path, config,
                                                              toolkit, interval, expected):
    ckpt = save_initial_checkpoint(config, str(tmp_path / 'init.pth'), seed=0)
    data = synthetic_root(toolkit, val_only)
    shows = tmp_path / 'pictures'
    out = tmp_path / 'metrics.json'
    proc = tool('tools/test.py', config, ckpt, '--data-root', data, '--work-dir',
                str(tmp_path / 'work'), '--show-dir', str(shows), '--show-interval',
                str(interval), '--out-metrics', str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())  # evaluated as well
    images = (sorted(os.listdir(os.path.join(data, 'val'))) if toolkit == 'mmdet' else
              sorted(os.listdir(os.path.join(data, 'images', 'validation'))))
    assert len(images) == 3
    names = [os.path.splitext(images[i])[0] + '.png' for i in expected]
    assert sorted(os.listdir(shows)) == names
    for name, index in zip(names, expected):
        picture = cv2.imread(str(shows / name))
        folder = 'val' if toolkit == 'mmdet' else os.path.join('images', 'validation')
        image = cv2.imread(os.path.join(data, folder, images[index]))
        # ground truth and prediction side by side, each at the image's size
        assert picture.shape[0] == image.shape[0]
        assert picture.shape[1] == 2 * image.shape[1]
