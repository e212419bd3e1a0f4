"""The demo's figure: loss curves and metrics, then the test tool's pictures of predictions."""
import cv2
import numpy as np

from swin_rpe_plugin.engine.demo import plot_results, prediction_pictures

CURVES = {'det': [(1, 2.0), (2, 1.5)], 'seg': [(1, 1.0), (2, 0.5)]}
METRICS = {'bbox_mAP': {'before': 0.0, 'after': 0.3}, 'mIoU': {'before': 5.0, 'after': 60.0}}


def test_pictures_folder_gives_the_first_pngs_by_name(tmp_path):
    for name in ('b.png', 'a.png', 'c.png', 'notes.txt'):
        (tmp_path / name).write_bytes(b'')
    assert prediction_pictures(str(tmp_path), 2) == [str(tmp_path / 'a.png'),
                                                      str(tmp_path / 'b.png')]
    assert prediction_pictures(str(tmp_path / 'missing'), 2) == []


def test_demo_figure_shows_the_prediction_pictures(tmp_path):
    pictures = {}
    for task, bgr in (('det', (0, 0, 255)), ('seg', (255, 0, 0))):  # pure red, pure blue
        path = tmp_path / f'{task}.png'
        cv2.imwrite(str(path), np.full((64, 128, 3), bgr, np.uint8))
        pictures[task] = [str(path)]
    plain = cv2.imread(plot_results(CURVES, METRICS, str(tmp_path / 'plain.png')))
    full = cv2.imread(plot_results(CURVES, METRICS, str(tmp_path / 'full.png'), pictures))
    assert full.shape[0] > plain.shape[0] and full.shape[1] == plain.shape[1]

    def count(image, bgr):
        return int(np.all(image == np.array(bgr, np.uint8), axis=-1).sum())

    # each picture is drawn at a visible size (more than 1000 of its pixels), only below
    assert count(plain, (0, 0, 255)) == 0 and count(plain, (255, 0, 0)) == 0
    assert count(full, (0, 0, 255)) > 1000 and count(full, (255, 0, 0)) > 1000
