"""Golden values published by public RNN-T projects: costs and gradients.

Every expected number below is copied from a public test suite (cited at each case), not
computed by this package. Each case runs against the compiled ops (tf_rnnt.rnnt_loss,
tf_rnnt.lattice_loss, tf_rnnt.flash_rnnt_loss), the pure-TF reference and the NumPy oracle.
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES

# ---------------------------------------------------------------------------------------------
# Case "small": B=1, T=2, U=2 (U+1=3), V=5, labels [1, 2].
# Logits and cost 4.495666: HawkAaron/warp-transducer, pytorch_binding/test/test.py,
# small_test(); the same file publishes d cost / d log_softmax(logits) (blank 0), which is
# d cost / d lattice scattered into the vocabulary (zero off the blank and label entries).
# d cost / d logits for blank 0: NVIDIA/NeMo, tests/collections/asr/numba/rnnt_loss/
# test_rnnt_pytorch.py, TestRNNTLossPytorch.test_case_small (same logits, cost 4.495666).
# Blank last (blank=-1), cost 5.09566688538 and d cost / d logits: pytorch/audio,
# test/torchaudio_unittest/common_utils/rnnt_utils.py, get_B1_T2_U3_D5_data().
SMALL_LOGITS = np.array([[[[0.1, 0.6, 0.1, 0.1, 0.1],
                           [0.1, 0.1, 0.6, 0.1, 0.1],
                           [0.1, 0.1, 0.2, 0.8, 0.1]],
                          [[0.1, 0.6, 0.1, 0.1, 0.1],
                           [0.1, 0.1, 0.2, 0.1, 0.1],
                           [0.7, 0.1, 0.2, 0.1, 0.1]]]])
SMALL_LABELS = np.array([[1, 2]], np.int32)
SMALL_LOGIT_LENGTHS = np.array([2], np.int32)
SMALL_LABEL_LENGTHS = np.array([2], np.int32)
SMALL_COST_BLANK_FIRST = 4.495666
SMALL_LOG_PROB_GRADS_BLANK_FIRST = np.array(
    [[[[-0.308198071906, -0.6918019280939998, 0.0, 0.0, 0.0],
       [-0.308198071906, 0.0, -0.3836038561880001, 0.0, 0.0],
       [-0.3836038561880001, 0.0, 0.0, 0.0, 0.0]],
      [[0.0, -0.308198071906, 0.0, 0.0, 0.0],
       [0.0, 0.0, -0.6163961438119995, 0.0, 0.0],
       [-0.9999999999999991, 0.0, 0.0, 0.0, 0.0]]]])
SMALL_LOGIT_GRADS_BLANK_FIRST = np.array(
    [[[[-0.13116688, -0.3999269, 0.17703125, 0.17703125, 0.17703125],
       [-0.18572757, 0.12247056, -0.18168412, 0.12247056, 0.12247056],
       [-0.32091254, 0.06269141, 0.06928472, 0.12624499, 0.06269141]],
      [[0.05456069, -0.21824276, 0.05456069, 0.05456069, 0.05456069],
       [0.12073959, 0.12073959, -0.48295835, 0.12073959, 0.12073959],
       [-0.6925882, 0.16871116, 0.18645467, 0.16871116, 0.16871116]]]])
SMALL_COST_BLANK_LAST = 5.09566688538
SMALL_LOGIT_GRADS_BLANK_LAST = np.array(
    [0.17703132, -0.39992708, 0.17703132, 0.17703132, -0.13116692,
     0.12247062, 0.12247062, -0.181684, 0.12247062, -0.1857276,
     0.06269141, 0.06269141, 0.06928471, 0.12624498, -0.32091248,
     0.05456069, -0.2182428, 0.05456069, 0.05456069, 0.05456069,
     0.12073967, 0.12073967, -0.48295838, 0.12073967, 0.12073967,
     0.30741188, 0.16871123, 0.18645471, 0.16871123, -0.83128875]).reshape(1, 2, 3, 5)

# ---------------------------------------------------------------------------------------------
# Case "big": B=2, T=4, U=2 (U+1=3), V=3, blank 0, labels [[1, 2], [1, 1]].
# Logits, costs and d cost / d log_softmax(logits): HawkAaron/warp-transducer,
# pytorch_binding/test/test.py, big_test(). d cost / d logits for the same logits: NVIDIA/NeMo,
# tests/collections/asr/numba/rnnt_loss/test_rnnt_pytorch.py, test_case_big_tensor (the same
# numbers, rounded to 6 decimals, are pytorch/audio's get_B2_T4_U3_D3_data()).
BIG_LOGITS = np.array([
    [[[0.06535690384862791, 0.7875301411923206, 0.08159176605666074],
      [0.5297155426466327, 0.7506749639230854, 0.7541348379087998],
      [0.6097641124736383, 0.8681404965673826, 0.6225318186056529]],
     [[0.6685222872103057, 0.8580392805336061, 0.16453892311765583],
      [0.989779515236694, 0.944298460961015, 0.6031678586829663],
      [0.9467833543605416, 0.666202507295747, 0.28688179752461884]],
     [[0.09418426230195986, 0.3666735970751962, 0.736168049462793],
      [0.1666804425271342, 0.7141542198635192, 0.3993997272216727],
      [0.5359823524146038, 0.29182076440286386, 0.6126422611507932]],
     [[0.3242405528768486, 0.8007644367291621, 0.5241057606558068],
      [0.779194617063042, 0.18331417220174862, 0.113745182072432],
      [0.24022162381327106, 0.3394695622533106, 0.1341595066017014]]],
    [[[0.5055615569388828, 0.051597282072282646, 0.6402903936686337],
      [0.43073311517251, 0.8294731834714112, 0.1774668847323424],
      [0.3207001991262245, 0.04288308912457006, 0.30280282975568984]],
     [[0.6751777088333762, 0.569537369330242, 0.5584738347504452],
      [0.08313242153985256, 0.06016544344162322, 0.10795752845152584],
      [0.7486153608562472, 0.943918041459349, 0.4863558118797222]],
     [[0.4181986264486809, 0.6524078485043804, 0.024242983423721887],
      [0.13458171554507403, 0.3663418070512402, 0.2958297395361563],
      [0.9236695822497084, 0.6899291482654177, 0.7418981733448822]],
     [[0.25000547599982104, 0.6034295486281007, 0.9872887878887768],
      [0.5926057265215715, 0.8846724004467684, 0.5434495396894328],
      [0.6607698886038497, 0.3771277082495921, 0.3580209022231813]]]])
BIG_LABELS = np.array([[1, 2], [1, 1]], np.int32)
BIG_LOGIT_LENGTHS = np.array([4, 4], np.int32)
BIG_LABEL_LENGTHS = np.array([2, 2], np.int32)
BIG_COSTS = np.array([4.2806528590890736, 3.9384369822503591])
BIG_LOG_PROB_GRADS = np.array([
    [[[-0.4322264564338117, -0.5677735435661883, 0.0],
      [-0.36565009313836844, 0.0, -0.20212345042782007],
      [-0.20212345042782007, 0.0, 0.0]],
     [[-0.16521672442463506, -0.2670097320091765, 0.0],
      [-0.3943653886107811, 0.0, -0.2382944365367636],
      [-0.44041788696458367, 0.0, 0.0]],
     [[-0.052129794015740985, -0.11308693040889405, 0.0],
      [-0.18313786985332664, 0.0, -0.3243144491663483],
      [-0.7647323361309323, 0.0, 0.0]],
     [[0.0, -0.052129794015740985, 0.0],
      [0.0, 0.0, -0.23526766386906767],
      [-1.0, 0.0, 0.0]]],
    [[[-0.7161424128232795, -0.2838575871767207, 0.0],
      [-0.18382932237365335, -0.10002826480306751, 0.0],
      [-0.10002826480306751, 0.0, 0.0]],
     [[-0.41121794618117213, -0.3049244666421072, 0.0],
      [-0.3295759402552584, -0.15917784876050195, 0.0],
      [-0.2592061135635692, 0.0, 0.0]],
     [[-0.11607642141651396, -0.29514152476465827, 0.0],
      [-0.2865333615432337, -0.3381841034766833, 0.0],
      [-0.5973902170402529, 0.0, 0.0]],
     [[0.0, -0.11607642141651396, 0.0],
      [0.0, -0.4026097829597475, 0.0],
      [-1.0, 0.0, 0.0]]]])
BIG_LOGIT_GRADS = np.array([
    [[[-1.86843902e-01, -6.25548810e-02, 2.49398798e-01],
      [-2.03376666e-01, 2.02399328e-01, 9.77333169e-04],
      [-1.41016081e-01, 7.91234672e-02, 6.18926100e-02]],
     [[-1.15517676e-02, -8.12802389e-02, 9.28319991e-02],
      [-1.54257029e-01, 2.29432687e-01, -7.51756504e-02],
      [-2.46593088e-01, 1.46404594e-01, 1.00188486e-01]],
     [[-1.29182907e-02, -6.15932420e-02, 7.45115355e-02],
      [-5.59857301e-02, 2.19830811e-01, -1.63845062e-01],
      [-4.97626871e-01, 2.09239945e-01, 2.88386941e-01]],
     [[1.36048580e-02, -3.02196294e-02, 1.66147724e-02],
      [1.13924511e-01, 6.27811998e-02, -1.76705718e-01],
      [-6.67078257e-01, 3.67658824e-01, 2.99419403e-01]]],
    [[[-3.56343776e-01, -5.53474613e-02, 4.11691219e-01],
      [-9.69219357e-02, 2.94591039e-02, 6.74628317e-02],
      [-6.35175705e-02, 2.76544970e-02, 3.58630717e-02]],
     [[-1.54499024e-01, -7.39420280e-02, 2.28441030e-01],
      [-1.66789949e-01, -8.78955179e-05, 1.66877866e-01],
      [-1.72369644e-01, 1.05565332e-01, 6.68043196e-02]],
     [[2.38748826e-02, -1.18255816e-01, 9.43809375e-02],
      [-1.04707085e-01, -1.08934477e-01, 2.13641584e-01],
      [-3.69844258e-01, 1.80118099e-01, 1.89726159e-01]],
     [[2.57137045e-02, -7.94617534e-02, 5.37480488e-02],
      [1.22328237e-01, -2.38788679e-01, 1.16460443e-01],
      [-5.98686993e-01, 3.02203178e-01, 2.96483815e-01]]]])

# ---------------------------------------------------------------------------------------------
# Joint cases: the older warp-transducer API took transcription (encoder) and prediction
# activations [B, T, V] / [B, U+1, V] and scored log_softmax(trans[b, t] + pred[b, u]): that is
# tf_rnnt's joint with activation="identity", kernel = I (V x V) and bias = 0, so the published
# d cost / d trans and d cost / d pred are our encoder and predictor gradients.
# Source: HawkAaron/warp-transducer, tensorflow_binding/tests/test_warprnnt_op.py,
# _test_basic (blank 0; costs published to 4 decimals) and _test_multiple_batches (blank 5 = the
# last of V=6: a published blank-last case; the same numbers, time-major, are in tests/test_cpu.cpp
# options_test of that repository).
JOINT_BASIC = dict(
    trans=np.array([[[0.06860042, 0.02114975, 0.9319364, 0.32975072, 0.13327402],
                     [0.12564015, 0.43477476, 0.5019661, 0.6318551, 0.56487304],
                     [0.7360039, 0.39700246, 0.50331944, 0.6365183, 0.19341111],
                     [0.7335776, 0.9189112, 0.65545017, 0.89854324, 0.0246467]]]),
    pred=np.array([[[0.1928187, 0.63991195, 0.7839058, 0.8364832, 0.55822134],
                    [0.11235255, 0.44893646, 0.46855223, 0.20775604, 0.9215501],
                    [0.1369242, 0.6790915, 0.3493181, 0.72844136, 0.46717978]]]),
    labels=np.array([[1, 2]], np.int32),
    logit_lengths=np.array([4], np.int32),
    label_lengths=np.array([2], np.int32),
    blank=0,
    costs=np.array([9.3370]),
    trans_grads=np.array([[[-0.85036933, -0.17704993, 0.4379695, 0.32460052, 0.26484928],
                           [-0.86005664, -0.01435287, 0.13164294, 0.36458912, 0.37817746],
                           [-0.7415191, 0.10448333, 0.01432155, 0.36094004, 0.2617742],
                           [-0.7804755, 0.3140569, -0.12812297, 0.4177104, 0.17683122]]]),
    pred_grads=np.array([[[-0.80384177, -0.66368896, 0.6344613, 0.51796013, 0.31510928],
                          [-0.65244085, 0.36658645, -0.5477955, 0.34172153, 0.49192834],
                          [-1.7761381, 0.5242399, 0.36914518, 0.60815847, 0.27459458]]]),
)
JOINT_MULTI = dict(
    trans=np.array([
        0.20836473, 0.68488914, 0.8508703, 0.5761989, 0.19992691, 0.8066367,
        0.9547191, 0.39503795, 0.91791826, 0.66354334, 0.52238625, 0.30651063,
        0.51816165, 0.83243364, 0.29219377, 0.35955018, 0.6904012, 0.85133505,
        0.87253755, 0.06845909, 0.74267465, 0.7473852, 0.6735857, 0.814946,
        0.72159135, 0.27252442, 0.20181221, 0.7149978, 0.7996553, 0.594097,
        0.98958284, 0.7198998, 0.32019693, 0.49187315, 0.82729864, 0.72087383,
        0.5865227, 0.84655076, 0.73006225, 0.24205732, 0.2466054, 0.93103373,
        0.6253804, 0.56404036, 0.59297657, 0.6260772, 0.23223883, 0.041093946]).reshape(2, 4, 6),
    pred=np.array([
        0.061166406, 0.14563453, 0.563884, 0.66322905, 0.19838423, 0.18207806,
        0.9041121, 0.31825322, 0.10209769, 0.44423354, 0.7338143, 0.22434187,
        0.7007454, 0.65526026, 0.5205059, 0.30149776, 0.6051819, 0.1901899,
        0.6904842, 0.30375922, 0.61894506, 0.032821894, 0.75227857, 0.8265933,
        0.79737663, 0.86086124, 0.4400267, 0.8985075, 0.3717013, 0.9338418,
        0.91288275, 0.6805384, 0.019013822, 0.84054446, 0.52986646, 0.27262968]).reshape(2, 3, 6),
    labels=np.array([[1, 2], [1, 1]], np.int32),
    logit_lengths=np.array([4, 4], np.int32),
    label_lengths=np.array([2, 2], np.int32),
    blank=5,
    costs=np.array([9.8610, 8.7003]),
    trans_grads=np.array([
        0.18298208713531494, -0.1863221824169159, 0.24029867351055145, 0.31508156657218933,
        0.17985235154628754, -0.7318925261497498, 0.3619690537452698, -0.06026348099112511,
        0.08730498701334, 0.25879740715026855, 0.22078825533390045, -0.8685961961746216,
        0.27959010004997253, 0.03639250993728638, -0.061875589191913605, 0.19594523310661316,
        0.30305129289627075, -0.753103494644165, 0.385039746761322, 0.06576273590326309,
        -0.18127907812595367, 0.2354261875152588, 0.28227531909942627, -0.7872248888015747,
        0.26263949275016785, -0.10713391751050949, 0.13813626766204834, 0.16261409223079681,
        0.2808478772640228, -0.7371038794517517, 0.3360159993171692, -0.1639198213815689,
        0.1387038677930832, 0.1545054018497467, 0.2540736496448517, -0.7193790674209595,
        0.29537156224250793, -0.274471253156662, 0.2312944084405899, 0.18443721532821655,
        0.16433767974376678, -0.6009695529937744, 0.4264937937259674, -0.4397970736026764,
        0.22451627254486084, 0.4020277261734009, 0.20442542433738708,
        -0.8176661133766174]).reshape(2, 4, 6),
    pred_grads=np.array([
        0.2336210012435913, -0.7242842316627502, 0.49153390526771545, 0.4382175803184509,
        0.2350836545228958, -0.6741719245910645, 0.5180250406265259, 0.26190635561943054,
        -0.7572638988494873, 0.29955601692199707, 0.3859791159629822, -0.7082027196884155,
        0.4579349160194397, 0.31794747710227966, 0.35017895698547363, 0.26747676730155945,
        0.3649044632911682, -1.7584426403045654, 0.5328136086463928, -0.7057985663414001,
        0.3393358588218689, 0.2234761267900467, 0.5142948627471924, -0.9041219353675842,
        0.4035489857196808, -0.5864231586456299, 0.24028921127319336, 0.3576064705848694,
        0.20584842562675476, -0.6208699345588684, 0.38415825366973877, 0.30689966678619385,
        0.15302574634552002, 0.3225018382072449, 0.18354131281375885,
        -1.35012686252594]).reshape(2, 3, 6),
)

# Published to ~7 significant digits (float32 runs): absolute tolerances at that level.
COST_ATOL = 2e-6
GRAD_ATOL = 2e-6
JOINT_COST_ATOL = 1e-4  # the joint cases' costs are published to 4 decimals
JOINT_GRAD_ATOL = 5e-6  # float32 runs of the older API; predictor grads reach 1.8 in magnitude


def _permute_blank_to_last(logits, labels, grads):
    """Blank-last variant of a blank-0 case: vocabulary index v -> (v - 1) mod V.

    Relabelling the classes changes nothing in the model, so the costs stay the published
    ones and the published gradients move with their classes.
    """
    vocab = logits.shape[-1]
    order = (np.arange(vocab) + 1) % vocab  # new index w holds old class (w + 1) mod V
    return logits[..., order], (labels - 1) % vocab, grads[..., order]


def _case(name):
    """(logits, labels, logit_lengths, label_lengths, blank, costs, d logits) of a golden case."""
    if name == "small_blank_first":
        return (SMALL_LOGITS, SMALL_LABELS, SMALL_LOGIT_LENGTHS, SMALL_LABEL_LENGTHS, 0,
                np.array([SMALL_COST_BLANK_FIRST]), SMALL_LOGIT_GRADS_BLANK_FIRST)
    if name == "small_blank_last":  # published by torchaudio with blank=-1
        return (SMALL_LOGITS, SMALL_LABELS, SMALL_LOGIT_LENGTHS, SMALL_LABEL_LENGTHS, -1,
                np.array([SMALL_COST_BLANK_LAST]), SMALL_LOGIT_GRADS_BLANK_LAST)
    if name == "small_blank_last_positive":  # the same case with blank given as V-1
        return (SMALL_LOGITS, SMALL_LABELS, SMALL_LOGIT_LENGTHS, SMALL_LABEL_LENGTHS, 4,
                np.array([SMALL_COST_BLANK_LAST]), SMALL_LOGIT_GRADS_BLANK_LAST)
    if name == "big_blank_first":
        return (BIG_LOGITS, BIG_LABELS, BIG_LOGIT_LENGTHS, BIG_LABEL_LENGTHS, 0, BIG_COSTS,
                BIG_LOGIT_GRADS)
    if name == "big_blank_last_permuted":
        # Constructed, not published as such: the published blank-0 "big" case with its
        # vocabulary permuted so that blank becomes the last class (see _permute_blank_to_last).
        logits, labels, grads = _permute_blank_to_last(BIG_LOGITS, BIG_LABELS, BIG_LOGIT_GRADS)
        return (logits, labels, BIG_LOGIT_LENGTHS, BIG_LABEL_LENGTHS, -1, BIG_COSTS, grads)
    raise KeyError(name)


CASES = ["small_blank_first", "small_blank_last", "small_blank_last_positive", "big_blank_first",
         "big_blank_last_permuted"]


def _costs_and_logit_grads(loss_fn, logits, labels, logit_lengths, label_lengths, blank):
    logits = tf.constant(logits, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        costs = loss_fn(logits, tf.constant(labels), tf.constant(logit_lengths),
                        tf.constant(label_lengths), blank=blank)
    grads = tape.gradient(costs, logits)
    return costs.numpy(), grads.numpy()


def _log_prob_grads_to_lattice(log_prob_grads, labels, blank):
    """Published d cost / d log_softmax -> d cost / d lattice [B, T, U+1, 2]."""
    vocab = log_prob_grads.shape[-1]
    blank = oracle.normalize_blank(blank, vocab)
    batch, max_t, max_u1, _ = log_prob_grads.shape
    lattice_grads = np.zeros((batch, max_t, max_u1, 2))
    lattice_grads[..., 0] = log_prob_grads[..., blank]
    for b in range(batch):
        for u in range(max_u1 - 1):
            lattice_grads[b, :, u, 1] = log_prob_grads[b, :, u, labels[b, u]]
    # The published gradient is zero off the blank and label entries: the mapping loses nothing.
    scattered = np.zeros_like(log_prob_grads)
    scattered[..., blank] = lattice_grads[..., 0]
    for b in range(batch):
        for u in range(max_u1 - 1):
            scattered[b, :, u, labels[b, u]] += lattice_grads[b, :, u, 1]
    np.testing.assert_allclose(scattered, log_prob_grads, atol=1e-12)
    return lattice_grads


LATTICE_CASES = [
    pytest.param(SMALL_LOGITS, SMALL_LABELS, SMALL_LOGIT_LENGTHS, SMALL_LABEL_LENGTHS,
                 np.array([SMALL_COST_BLANK_FIRST]), SMALL_LOG_PROB_GRADS_BLANK_FIRST, id="small"),
    pytest.param(BIG_LOGITS, BIG_LABELS, BIG_LOGIT_LENGTHS, BIG_LABEL_LENGTHS, BIG_COSTS,
                 BIG_LOG_PROB_GRADS, id="big"),
]


# ------------------------------------------------------------------------------ the oracles

@pytest.mark.parametrize("name", CASES)
def test_oracle_matches_golden(name):
    logits, labels, logit_lengths, label_lengths, blank, costs, grads = _case(name)
    got_costs, got_grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, blank)
    np.testing.assert_allclose(got_costs, costs, rtol=0, atol=COST_ATOL)
    np.testing.assert_allclose(got_grads, grads, rtol=0, atol=GRAD_ATOL)


@pytest.mark.parametrize("logits,labels,logit_lengths,label_lengths,costs,log_prob_grads",
                         LATTICE_CASES)
def test_oracle_lattice_matches_golden(logits, labels, logit_lengths, label_lengths, costs,
                                       log_prob_grads):
    lattice = oracle.lattice_from_logits(logits, labels, 0)
    got_costs, got_grads = oracle.lattice_loss(lattice, logit_lengths, label_lengths)
    np.testing.assert_allclose(got_costs, costs, rtol=0, atol=COST_ATOL)
    np.testing.assert_allclose(got_grads, _log_prob_grads_to_lattice(log_prob_grads, labels, 0),
                               rtol=0, atol=GRAD_ATOL)


@pytest.mark.parametrize("name", CASES)
def test_reference_matches_golden(name):
    from tf_rnnt import reference
    logits, labels, logit_lengths, label_lengths, blank, costs, grads = _case(name)
    got_costs, got_grads = _costs_and_logit_grads(reference.rnnt_loss, logits, labels,
                                                  logit_lengths, label_lengths, blank)
    np.testing.assert_allclose(got_costs, costs, rtol=0, atol=COST_ATOL)
    np.testing.assert_allclose(got_grads, grads, rtol=0, atol=GRAD_ATOL)


@pytest.mark.parametrize("case", [JOINT_BASIC, JOINT_MULTI], ids=["blank_first", "blank_last"])
def test_oracle_joint_matches_golden(case):
    vocab = case["trans"].shape[-1]
    costs, d_enc, d_pred, _, _ = oracle.flash_rnnt_loss(
        case["trans"], case["pred"], np.eye(vocab), np.zeros(vocab), case["labels"],
        case["logit_lengths"], case["label_lengths"], case["blank"], "identity")
    np.testing.assert_allclose(costs, case["costs"], rtol=0, atol=JOINT_COST_ATOL)
    np.testing.assert_allclose(d_enc, case["trans_grads"], rtol=0, atol=JOINT_GRAD_ATOL)
    np.testing.assert_allclose(d_pred, case["pred_grads"], rtol=0, atol=JOINT_GRAD_ATOL)


# ------------------------------------------------------------------------------ the compiled ops

@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_matches_golden(name, device):
    import tf_rnnt
    logits, labels, logit_lengths, label_lengths, blank, costs, grads = _case(name)
    with tf.device(device):
        got_costs, got_grads = _costs_and_logit_grads(tf_rnnt.rnnt_loss, logits, labels,
                                                      logit_lengths, label_lengths, blank)
    np.testing.assert_allclose(got_costs, costs, rtol=0, atol=COST_ATOL)
    np.testing.assert_allclose(got_grads, grads, rtol=0, atol=GRAD_ATOL)


@pytest.mark.parametrize("logits,labels,logit_lengths,label_lengths,costs,log_prob_grads",
                         LATTICE_CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_matches_golden(logits, labels, logit_lengths, label_lengths, costs,
                                     log_prob_grads, device):
    import tf_rnnt
    lattice_np = oracle.lattice_from_logits(logits, labels, 0)
    with tf.device(device):
        lattice = tf.constant(lattice_np, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(lattice)
            got_costs = tf_rnnt.lattice_loss(lattice, tf.constant(logit_lengths),
                                             tf.constant(label_lengths))
        got_grads = tape.gradient(got_costs, lattice)
    np.testing.assert_allclose(got_costs.numpy(), costs, rtol=0, atol=COST_ATOL)
    np.testing.assert_allclose(got_grads.numpy(),
                               _log_prob_grads_to_lattice(log_prob_grads, labels, 0),
                               rtol=0, atol=GRAD_ATOL)


@pytest.mark.parametrize("case", [JOINT_BASIC, JOINT_MULTI], ids=["blank_first", "blank_last"])
@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_matches_golden(case, mode, device):
    import tf_rnnt
    vocab = case["trans"].shape[-1]
    # kernel = I is exact in float32, not under TF32 (conftest turns TF32 off).
    with tf.device(device):
        encoder = tf.constant(case["trans"], tf.float32)
        predictor = tf.constant(case["pred"], tf.float32)
        with tf.GradientTape() as tape:
            tape.watch([encoder, predictor])
            costs = tf_rnnt.flash_rnnt_loss(
                encoder, predictor, tf.eye(vocab), tf.zeros([vocab]),
                tf.constant(case["labels"]), tf.constant(case["logit_lengths"]),
                tf.constant(case["label_lengths"]), blank=case["blank"],
                activation="identity", mode=mode)
        d_enc, d_pred = tape.gradient(costs, [encoder, predictor])
    np.testing.assert_allclose(costs.numpy(), case["costs"], rtol=0, atol=JOINT_COST_ATOL)
    np.testing.assert_allclose(d_enc.numpy(), case["trans_grads"], rtol=0, atol=JOINT_GRAD_ATOL)
    np.testing.assert_allclose(d_pred.numpy(), case["pred_grads"], rtol=0, atol=JOINT_GRAD_ATOL)


@pytest.mark.parametrize("case", [JOINT_BASIC, JOINT_MULTI], ids=["blank_first", "blank_last"])
def test_reference_flash_rnnt_loss_matches_golden(case):
    from tf_rnnt import reference
    vocab = case["trans"].shape[-1]
    encoder = tf.constant(case["trans"], tf.float32)
    predictor = tf.constant(case["pred"], tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([encoder, predictor])
        costs = reference.flash_rnnt_loss(
            encoder, predictor, tf.eye(vocab), tf.zeros([vocab]), case["labels"],
            case["logit_lengths"], case["label_lengths"], blank=case["blank"],
            activation="identity")
    d_enc, d_pred = tape.gradient(costs, [encoder, predictor])
    np.testing.assert_allclose(costs.numpy(), case["costs"], rtol=0, atol=JOINT_COST_ATOL)
    np.testing.assert_allclose(d_enc.numpy(), case["trans_grads"], rtol=0, atol=JOINT_GRAD_ATOL)
    np.testing.assert_allclose(d_pred.numpy(), case["pred_grads"], rtol=0, atol=JOINT_GRAD_ATOL)
