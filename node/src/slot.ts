// Redis Cluster's key slot (CRC16/XMODEM of the key or its {hash tag}, mod 16384).

const TABLE = new Uint16Array(256);
for (let i = 0; i < 256; i++) {
  let crc = i << 8;
  for (let bit = 0; bit < 8; bit++) {
    crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
  }
  TABLE[i] = crc & 0xffff;
}

function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) {
    crc = ((crc << 8) & 0xffff) ^ (TABLE[((crc >> 8) ^ byte) & 0xff] ?? 0);
  }
  return crc;
}

export function keySlot(key: string): number {
  let bytes = Buffer.from(key);
  const open = bytes.indexOf(0x7b); // {
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // }
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  return crc16(bytes) % 16384;
}
