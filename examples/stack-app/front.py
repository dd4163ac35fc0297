# The front tier: GET / answers "front: " and what the api said.
import http.server, urllib.request
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'front: ' + urllib.request.urlopen('http://api:8000/hits', timeout=3).read()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', 80), H).serve_forever()
