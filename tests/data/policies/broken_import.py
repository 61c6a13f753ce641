import servesim

x = 1 / 0
