"""Calibration images: read and preprocessed as the model's own data preprocessor does."""
import numpy as np
import pytest
import torch

from swin_rpe_plugin.deploy.calibration import calibration_batches, image_files


def test_images_are_preprocessed_as_the_data_preprocessor_does(tmp_path):
    import cv2
    from mmdet.models.data_preprocessors import DetDataPreprocessor
    rng = np.random.default_rng(0)
    pictures = [rng.integers(0, 256, (40, 60, 3), dtype=np.uint8) for _ in range(3)]
    for i, picture in enumerate(pictures):
        cv2.imwrite(str(tmp_path / f'{i}.png'), picture)  # BGR on disk, as cv2 writes it
    (tmp_path / 'notes.txt').write_text('not an image')
    mean, std = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]
    preprocessor = DetDataPreprocessor(mean=mean, std=std, bgr_to_rgb=True)
    batches = calibration_batches(str(tmp_path), preprocessor, (40, 60), limit=2)
    assert len(batches) == 2 and batches[0].shape == (1, 3, 40, 60)
    rgb = pictures[0][..., ::-1].astype(np.float32).transpose(2, 0, 1)  # the reference
    expected = (rgb - np.array(mean, np.float32)[:, None, None]) / np.array(std, np.float32)[
        :, None, None]
    np.testing.assert_allclose(batches[0][0], expected, rtol=1e-5, atol=1e-5)


def test_a_folder_without_images_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match='calibration folder not found: .*nowhere'):
        image_files(str(tmp_path / 'nowhere'))
    (tmp_path / 'a.txt').write_text('')
    with pytest.raises(ValueError, match=r'^no images \(\.jpg, .*\) under '):
        image_files(str(tmp_path))
