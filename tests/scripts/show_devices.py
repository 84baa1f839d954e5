"""An unmodified script: prints its arguments, logical CPUs, where one op runs, the precision policy and a stdin
line, then exits with the code given as its first argument."""
import sys

import keras
import tensorflow as tf

print("argv", sys.argv[1:])
print("logical", [d.name for d in tf.config.list_logical_devices("CPU")])
with tf.device("/cpu:1"):
    total = tf.reduce_sum(tf.ones((3, 3)))
print("sum", float(total))
print("policy", keras.mixed_precision.global_policy().name)
print("stdin", sys.stdin.readline().strip())
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
