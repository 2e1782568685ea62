"""How good a reconstruction is: image metrics (PSNR, SSIM, one-to-one matching, exact
recoveries), the KKT release's metrics, and the success bounds a run is compared to.

It may import ``attacks``, ``defenses``, ``auditing`` and the zoo.
"""
