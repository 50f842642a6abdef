"""CIFAR-10/100's files: their class names, published normalisation, and one split opened through torchvision, checked
before use (a missing or broken file is named). `torch/cifar10` and `vit.data.CIFARDataModule` both read them here."""

import pickle
from pathlib import Path

from torchvision import datasets

from vit.data.files import cifar_problem
from vit.data.transforms import DataError

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_CLASSES = """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin
elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man
maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain
plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake
spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle
wardrobe whale willow_tree wolf woman worm""".split()


def open_cifar(dataset: str, root: str, train: bool, transform=None, download: bool = True) -> datasets.CIFAR10:
    """One split of CIFAR-10/100 from `root`, or a DataError that names the missing or unreadable file."""
    cls = datasets.CIFAR10 if dataset == "cifar10" else datasets.CIFAR100
    try:
        ds = cls(root, train=train, transform=transform, download=download)
    except (KeyError, ValueError, TypeError, AttributeError, EOFError, pickle.UnpicklingError) as e:
        # the files are there (their checksums passed) but not in the layout torchvision reads: name the file
        folder = Path(root, cls.base_folder)
        cifar10 = dataset == "cifar10"
        labels, names = ("labels", "label_names") if cifar10 else ("fine_labels", "fine_label_names")
        batches = [n for n, _ in cls.train_list + cls.test_list]
        problem = cifar_problem(folder, batches, cls.meta["filename"], labels, names)
        raise DataError(problem or f"{folder}: not readable as {dataset} ({type(e).__name__}: {e})") from None
    except (OSError, RuntimeError) as e:  # URLError is an OSError; torchvision raises RuntimeError if absent
        reason = getattr(e, "reason", None) or str(e).splitlines()[0]
        raise DataError(
            f"{dataset} not found in {root}/ and not downloadable ({reason}): put "
            f"{cls.filename} (from {cls.url.rsplit('/', 1)[0]}/) in {root}/ and run again; "
            "`make train` runs the offline digits demo"
        ) from None
    if ds.classes != list(CIFAR10_CLASSES if dataset == "cifar10" else CIFAR100_CLASSES):
        raise DataError(
            f"{root}/{cls.base_folder}/{cls.meta['filename']}: class names {ds.classes[:3]}... differ from {dataset}'s"
        )
    return ds
